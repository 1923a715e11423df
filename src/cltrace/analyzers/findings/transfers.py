"""Many small transfers: each pays a fixed launch and latency cost that a batched one pays once."""
from __future__ import annotations

import numpy as np

from ...timeline.spans import TRANSFER
from ..text import fmt_ns
from .base import Context, Finding, instance, worst

SMALL_BYTES = 64 * 1024
MANY = 100  # at least this many small transfers
SHARE = 0.5  # making up at least this share of all transfers


def small_transfers(ctx: Context) -> Finding | None:
    td = ctx.td
    idx = np.flatnonzero(td.cat_mask(TRANSFER))
    if not len(idx):
        return None
    nbytes = np.array([td.attr(int(i), "bytes") or -1 for i in idx], np.int64)
    small = idx[(nbytes >= 0) & (nbytes < SMALL_BYTES)]
    if len(small) < MANY or len(small) < SHARE * len(idx):
        return None
    host = (td.host_end[small] - td.host_begin[small]).astype(np.int64)
    total_bytes = int(nbytes[(nbytes >= 0) & (nbytes < SMALL_BYTES)].sum())
    return Finding(
        "small-transfers", "Many small transfers", int(host.sum()),
        f"{len(small)} of {len(idx)} transfers moved < {SMALL_BYTES // 1024} KiB each "
        f"({total_bytes / len(small):.0f} B on average), {fmt_ns(host.sum())} of host time in all",
        "Batch them: pack small arrays into one buffer and copy it once, or keep the data on the device.",
        f">= {MANY} transfers under {SMALL_BYTES // 1024} KiB, >= {SHARE:.0%} of all transfers",
        {"small": len(small), "transfers": len(idx), "bytes": total_bytes, "host_ns": int(host.sum())},
        [instance(td, int(small[k]), bytes=td.attr(int(small[k]), "bytes")) for k in worst(host)])

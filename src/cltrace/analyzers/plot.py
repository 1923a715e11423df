"""``--plot FILE.png``: device utilisation over time per queue, queue depth, and the top kernels.

matplotlib is an optional extra (``pip install cltrace[plot]``); it is imported here only.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import MissingExtraError
from ..export.base import create_output

if TYPE_CHECKING:
    from .analysis import Analysis


def plot(a: "Analysis", path: str | os.PathLike[str], top: int = 10) -> str:
    """Write the picture to ``path`` (its folder is created) and return the path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ModuleNotFoundError:
        raise MissingExtraError("--plot", "plot") from None
    path = os.fspath(path)
    queues = a.timeline["queues"]
    depth = a.launches["queue_depth"]
    n = max(len(queues), 1)
    fig, axes = plt.subplots(n + 1, 1, figsize=(11, 2.2 * n + 3.2),
                             gridspec_kw={"height_ratios": [1.0] * n + [1.4]})
    bin_s = a.timeline["bin_ns"] / 1e9
    for ax, (name, busy) in zip(axes[:-1], queues.items()):
        t = np.arange(len(busy)) * bin_s
        ax.fill_between(t, np.array(busy) * 100, step="post", color="tab:blue", alpha=0.6, label="busy %")
        ax.set_ylim(0, 105)
        ax.set_ylabel("busy %")
        use = next((q for q in a.queues if q["name"] == name), None)
        ax.set_title(f"{name}: busy {use['busy_pct']:.1f}% of {a.wall['wall_ns'] / 1e9:.3f} s" if use else name,
                     fontsize=10, loc="left")
        d = depth.get(name)
        if d:
            ax2 = ax.twinx()
            ax2.step(np.arange(len(d["max_per_bin"])) * bin_s, d["max_per_bin"], where="post", color="tab:orange",
                     lw=1, label="queue depth")
            ax2.set_ylabel("commands in flight", color="tab:orange")
            ax2.set_ylim(0, max(d["max"], 1) * 1.1)
    axes[-2].set_xlabel("seconds since the first span")
    kernels = sorted(a.kernels, key=lambda r: -r["total_ns"])[:top]
    ax = axes[-1]
    if kernels:
        several = len({k.get("device", "") for k in a.kernels}) > 1
        names = [k["name"] + (f" [{k['shape']}]" if k.get("shape") else "") +
                 (f" ({k.get('device', '')})" if several else "") for k in kernels][::-1]
        totals = [k["total_ns"] / 1e6 for k in kernels][::-1]
        ax.barh(names, totals, color="tab:green")
        for y, k in enumerate(kernels[::-1]):
            ax.text(totals[y], y, f" {k['count']}x, {k['device_pct']:.1f}%", va="center", fontsize=8)
        ax.set_xlabel("total device time (ms)")
        ax.set_title(f"top {len(kernels)} kernels by device time", fontsize=10, loc="left")
    else:
        ax.text(0.5, 0.5, "no kernels with device times", ha="center", va="center")
        ax.set_axis_off()
    fig.suptitle(f"cltrace analyze: {os.path.basename(a.source)}", fontsize=11)
    fig.tight_layout()
    with create_output(path) as fh:  # 0644 in 0755 folders, whatever the umask
        fig.savefig(fh, dpi=110, format=os.path.splitext(path)[1][1:].lower() or None)
    plt.close(fig)
    return path

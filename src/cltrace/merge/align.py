"""Where each merged file's host times go on the merged timeline, and how sure that is.

Files of one boot of one machine share the host clock (``timeline.host``): their times are kept
as they are, exactly. A file from another machine (or one that does not say which) is moved by
the difference of the Unix-time offsets recorded with each file's start (``start_unix_ns -
start_ns``); that placement is as good as the two machines' wall clocks agree, which cltrace does
not measure. Files of one other machine move together, so they stay exact among themselves.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..timeline.host import same_clock

SAME_CLOCK = "same host clock"
UNIX_TIME = "unix time"


@dataclass
class Alignment:
    shift_ns: int  # added to the file's host times
    method: str  # SAME_CLOCK or UNIX_TIME
    domain: int  # clock domain: 0 is the first file's host clock
    host: str
    uncertainty: str

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "shift_ns": self.shift_ns, "host": self.host,
                "uncertainty_ns": 0 if self.method == SAME_CLOCK else None, "uncertainty": self.uncertainty}


def align(metas: Sequence[dict[str, Any]]) -> list[Alignment]:
    """One Alignment per file's metadata (which has ``start_ns`` and ``start_unix_ns``), relative
    to the first file."""
    domains: list[tuple[Any, int, str]] = []  # (host identity, Unix offset, host name) of each domain's first file
    out = []
    for meta in metas:
        ident = meta.get("host")
        name = str(ident.get("name", "")) if isinstance(ident, dict) else ""
        offset = int(meta["start_unix_ns"]) - int(meta["start_ns"])
        d = next((i for i, (other, _, _) in enumerate(domains) if same_clock(ident, other)), None)
        if d is None:
            d = len(domains)
            domains.append((ident, offset, name))
        if d == 0:
            out.append(Alignment(0, SAME_CLOCK, 0, name, "exact: one host clock"))
            continue
        ref = domains[0][2] or "the first file's host"
        why = "another host" if name and name != domains[0][2] else (
            "another boot of the host" if name else "a host the file does not name")
        out.append(Alignment(domains[d][1] - domains[0][1], UNIX_TIME, d, name,
                             f"{why}: placed by Unix time, off by as much as the wall clocks of "
                             f"{name or 'that host'} and {ref} disagree (not measured; NTP keeps "
                             "them within a few ms)"))
    return out

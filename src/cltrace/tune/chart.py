"""The picture of an autotune run that tells how its winner was chosen, not only who was fastest.

A sweep's fastest-looking trials are often only the luckiest, so the winner comes from the
confirmation rounds (see ``confirm``). ``roles`` says, per configuration, what part it played
(winner, default, within noise, not confirmed, sweep only) and why; ``figure`` draws it: the
winner first, each row's sweep and round figures (median, p10-p90, each round's median), the
noise band around the fastest re-measured candidate, the default's p10 a real win must beat, a
note per row and a caption saying how the winner was chosen. matplotlib is imported here only.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any

from ..errors import MissingExtraError
from .config import Config
from .rounds import round_medians, rounds_won


WINNER = "winner"
DEFAULT = "default"
WITHIN_NOISE = "within noise"
NOT_CONFIRMED = "not confirmed"
FAILED_ROUNDS = "failed in the rounds"
SWEEP_ONLY = "sweep only"

COLORS = {WINNER: "tab:green", DEFAULT: "tab:orange", WITHIN_NOISE: "tab:blue", NOT_CONFIRMED: "tab:red",
          FAILED_ROUNDS: "tab:red", SWEEP_ONLY: "tab:gray"}
NOISE_BAND = "noise-band"  # the gid of the band's patch
DEFAULT_P10 = "default-p10"  # the gid of the default's p10 line


@dataclass(frozen=True)
class Role:
    """What one configuration was in the decision: ``kind`` (one of the names above) and ``note``, the why."""

    config: Config
    kind: str
    note: str
    sweep: Any  # its sweep Trial, or None when only the rounds measured it
    rounds: Any  # its confirmation Trial, or None when it was not re-measured


def roles(result: Any) -> list[Role]:
    """Every configuration with figures, in the picture's order: the winner (or the kept default) first,
    then the re-measured candidates by their round medians, then the sweep-only trials by median."""
    conf = result.confirmation
    tol = result.tolerance
    winner, default = result.winner, result.default
    sweep = {t.config: t for t in result.ranked()}
    judged = {t.config: t for t in conf.trials} if conf is not None else dict(sweep)
    cands = [t for c, t in judged.items() if t.ok and c != default]
    fastest = min(cands, key=lambda t: t.median_ns) if cands else None
    base = judged.get(default) if default is not None else None
    base = base if base is not None and base.ok else None
    source = "rounds" if conf is not None else "sweep"

    def kind_note(c: Config) -> tuple[str, str]:
        t = judged.get(c)
        if c == winner:
            how = ("the fastest in the " + source if fastest is not None and fastest.config == c else
                   f"within noise of the fastest\n({fastest.config.label()}), first in sweep order"
                   if fastest is not None else "")
            sp = result.speedup()
            beats = f"\n{sp:.2f}x the default" if sp and base is not None else ""
            if conf is not None and base is not None and t is not None and t.ok:
                beats += f", won {rounds_won(t.times_ns, base.times_ns, tol, conf.runs)} of {conf.rounds} rounds"
            return WINNER, f"WINNER: {how}{beats}" if how else "WINNER"
        if c == default:
            if result.real_win is False:
                return DEFAULT, "default, KEPT: no candidate clearly beats it (no real win)"
            return DEFAULT, "untuned default"
        if t is None:
            s = sweep[c]
            looked = ("looked faster than the winner; " if winner in sweep
                      and s.median_ns < sweep[winner].median_ns else "")
            sf = min((x for x in sweep.values() if x.config != default), key=lambda x: x.median_ns, default=None)
            if conf is not None and sf is not None and not sf.clearly_faster_than(s, tol):
                return SWEEP_ONLY, (f"sweep only: {looked}within noise of the sweep's fastest, "
                                    "later in sweep order, so not re-measured")
            return SWEEP_ONLY, f"sweep only: {looked}clearly slower than the sweep's fastest"
        if not t.ok:
            return FAILED_ROUNDS, f"failed in the rounds [{t.stage}]"
        if fastest is not None and fastest.clearly_faster_than(t, tol):
            if conf is None:
                return SWEEP_ONLY, "clearly slower than the sweep's fastest (no confirmation rounds)"
            looked = (winner is not None and c in sweep and winner in sweep
                      and sweep[c].median_ns < sweep[winner].median_ns)
            return NOT_CONFIRMED, (("looked faster in the sweep; " if looked else "")
                                   + f"not confirmed: clearly slower than the fastest in the {source}")
        if result.real_win is False and base is not None:
            return WITHIN_NOISE, "within noise of the fastest; does not clearly beat the default"
        if fastest is not None and fastest.config == c:
            return WITHIN_NOISE, f"fastest in the {source}, but later in sweep order than the winner (within noise)"
        return WITHIN_NOISE, "within noise of the fastest, later in sweep order"

    head = winner if winner is not None else (default if result.real_win is False else None)
    mid = sorted((c for c in judged if c != head), key=lambda c: (not judged[c].ok, judged[c].median_ns or 0))
    rest = [c for c in sweep if c != head and c not in judged] if conf is not None else []
    order = ([head] if head is not None and (head in judged or head in sweep) else []) + mid + rest
    out = []
    for c in order:
        kind, note = kind_note(c)
        out.append(Role(c, kind, note, sweep.get(c), conf.trial(c) if conf is not None else None))
    return out


def caption(result: Any) -> str:
    """How the winner was chosen, in words, for under the chart."""
    conf, tol = result.confirmation, result.tolerance
    if conf is not None:
        how = (f"The sweep's fastest {len(conf.trials) - (1 if conf.default is not None else 0)} and the default "
               f"were re-measured in {conf.rounds} interleaved rounds x {conf.runs} launches. ")
    else:
        how = "No confirmation rounds: decided on the sweep's figures. "
    how += (f"Candidates the fastest does not clearly beat (its p90 below their p10 and its median over "
            f"{tol:.0%} below theirs) are within noise of it (the shaded band: the fastest's p10-p90); the first "
            f"of them in sweep order is chosen. It is a real win only when its median is below the default's p10"
            + (" and it wins at least 4 in 5 rounds" if conf is not None else "") + "; else the default is kept.")
    return how


def figure(result: Any, top: int = 15) -> Any:
    """The matplotlib figure; see the module docstring. Of the sweep-only trials, the ``top`` fastest are drawn
    (a grid sweep may run hundreds); the rest are counted under the chart."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError:
        raise MissingExtraError("AutotuneResult.plot", "plot") from None
    rows = [r for r in roles(result) if (r.sweep is not None and r.sweep.ok) or (r.rounds is not None and r.rounds.ok)]
    if not rows:
        raise ValueError("AutotuneResult.plot: no successful trial to plot")
    sweep_only = [i for i, r in enumerate(rows) if r.kind == SWEEP_ONLY]
    hidden = len(sweep_only[top:])
    if hidden:
        rows = rows[:sweep_only[top]] if top > 0 else [r for r in rows if r.kind != SWEEP_ONLY]
    flops = result.flops
    conf = result.confirmation

    def val(ns: float) -> float:
        return flops / ns if flops else ns / 1e6

    top_in, bottom_in, rows_in = 0.75, 2.1, max(1.2, 0.3 * len(rows))
    height = top_in + rows_in + bottom_in
    fig, ax = plt.subplots(figsize=(13, height))
    fig.subplots_adjust(left=2.4 / 13, right=7.6 / 13, top=1 - top_in / height, bottom=bottom_in / height)
    split = None
    for y, r in enumerate(rows):
        color = COLORS[r.kind]
        if r.sweep is not None and r.sweep.ok:
            yy = y + (0.17 if r.rounds is not None else 0.0)
            ax.hlines(yy, val(r.sweep.p10_ns), val(r.sweep.p90_ns), color=color, alpha=0.45, lw=1.5)
            ax.plot([val(r.sweep.median_ns)], [yy], "o", mfc="white", mec=color, ms=5)
        if r.rounds is not None and r.rounds.ok:
            yy = y - (0.17 if r.sweep is not None else 0.0)
            ax.hlines(yy, val(r.rounds.p10_ns), val(r.rounds.p90_ns), color=color, lw=4)
            ax.plot([val(r.rounds.median_ns)], [yy], "D", color=color, mec="black", mew=0.5, ms=6)
            if conf is not None:
                meds = round_medians(r.rounds.times_ns, conf.runs)
                ax.plot([val(m) for m in meds], [yy] * len(meds), "|", color="black", ms=9, mew=1)
        elif r.rounds is None and conf is not None and split is None:
            split = y
        note = "\n".join(w for line in r.note.split("\n") for w in textwrap.wrap(line, 80))
        ax.annotate(note, xy=(1.01, y), xycoords=ax.get_yaxis_transform(), va="center", ha="left",
                    fontsize=7, color=color, fontweight="bold" if r.kind == WINNER else "normal",
                    annotation_clip=False)
    if split is not None and split > 0:
        ax.axhline(split - 0.5, color="gray", lw=0.6, ls=":")
    ax.set_yticks(range(len(rows)), [r.config.label() + (f" ({r.kind})" if r.kind in (WINNER, DEFAULT) else "")
                                     for r in rows], fontsize=7)
    for tick, r in zip(ax.get_yticklabels(), rows):
        tick.set_color(COLORS[r.kind] if r.kind in (WINNER, DEFAULT) else "black")
        if r.kind == WINNER:
            tick.set_fontweight("bold")
    ax.set_ylim(len(rows) - 0.5, -0.7)

    judged = conf.trials if conf is not None else tuple(r.sweep for r in rows if r.sweep is not None)
    cands = [t for t in judged if t.ok and t.config != result.default]
    fastest = min(cands, key=lambda t: t.median_ns) if cands else None
    handles: list[Any] = [
        Line2D([], [], color="gray", alpha=0.6, lw=1.5, marker="o", mfc="white", label="sweep: median, p10-p90")]
    if conf is not None:
        handles += [Line2D([], [], color="gray", lw=4, marker="D", mec="black", label="rounds: median, p10-p90"),
                    Line2D([], [], color="black", lw=0, marker="|", ms=9, label="each round's median")]
    if fastest is not None:
        lo, hi = sorted((val(fastest.p10_ns), val(fastest.p90_ns)))
        band = ax.axvspan(lo, hi, color="tab:green", alpha=0.12, zorder=0)
        band.set_gid(NOISE_BAND)
        band.set_label(f"noise band: p10-p90 of the fastest ({fastest.config.label()})")
        handles.append(band)
    base = next((t for t in judged if t.ok and t.config == result.default), None)
    if base is not None:
        line = ax.axvline(val(base.p10_ns), color="tab:orange", ls="--", lw=1)
        line.set_gid(DEFAULT_P10)
        line.set_label("default's p10: a real win's median must be " + ("right" if flops else "left") + " of it")
        handles.append(line)
    handles += [Patch(color=COLORS[k], label=k + (" (not re-measured)" if k == SWEEP_ONLY else "")) for k in (WINNER, DEFAULT, WITHIN_NOISE, NOT_CONFIRMED, SWEEP_ONLY)
                if any(r.kind == k for r in rows)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, -0.5 / rows_in), fontsize=6.5, ncol=2,
              frameon=False)
    ax.set_xlabel("GFLOP/s at the device time (right is faster)" if flops else
                  "device time per launch, ms (left is faster)")
    ax.grid(axis="x", alpha=0.3)
    fails = len(result.failures())
    win = result.winner
    sp = result.speedup()
    sub = (f"winner {win.label()}, {sp:.2f}x the default (confirmed)" if win is not None and result.real_win and sp
           else f"winner {win.label()} (no default measured)" if win is not None
           else "no real win over the default: default kept" if result.real_win is False else "")
    ax.set_title(f"{result._title()}: {len(result.ranked())} ok, {fails} failed" + (f"\n{sub}" if sub else ""),
                 fontsize=9)
    more = f"{hidden} more sweep-only trials, slower in the sweep, not drawn. " if hidden else ""
    fig.text(0.01, 0.08 / height, "\n".join(textwrap.wrap(more + caption(result), 200)), fontsize=6.5, va="bottom",
             ha="left")
    return fig


def close(fig: Any) -> None:
    """Let pyplot forget a figure ``figure`` made (matplotlib is there: it drew it)."""
    import matplotlib.pyplot as plt

    plt.close(fig)

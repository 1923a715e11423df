"""The ``cltrace`` command: devices, demo, summary, analyze, diff, run, merge, open, tune."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

from .checks import check_device, check_plot_path, percent, port, whole_number
from .large import add_size_arguments, analyze_via_store, diff_via_store, summary_via_store, via_store
from .windows import add_window_arguments, no_window_on_store, window_of

FORMATS = ("json", "pftrace")


class _Parser(argparse.ArgumentParser):
    """A usage error is one line, ``cltrace: error: ...``, and exit status 2."""

    def error(self, message: str) -> Any:
        self.exit(2, f"cltrace: error: {message} (see {self.prog} --help)\n")


def _formats(value: str) -> tuple[str, ...]:
    fmts = tuple(f.strip() for f in value.split(",") if f.strip())
    bad = [f for f in fmts if f not in FORMATS]
    if bad or not fmts:
        raise argparse.ArgumentTypeError(f"unknown format(s) {bad}: choose from {', '.join(FORMATS)}")
    return fmts


def _schedule(value: str) -> Any:
    from ..capture.schedule import parse_schedule

    try:
        return parse_schedule(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _otlp_sinks(args: argparse.Namespace) -> list[Any]:
    """The OTLP sink of ``--otlp``, else the one OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT asks for (the
    protocol, headers and timeout from the other OTEL_EXPORTER_OTLP_* variables, as ``CLTRACE=1``
    reads them), else none. A setting that cannot be used is a ``CltraceError`` naming the fix."""
    from ..capture.session import otlp_configured

    if not getattr(args, "otlp", None) and not otlp_configured():
        return []
    from ..export.otlp import OtlpSink

    from ..errors import CltraceError, MissingExtraError
    from ..export.otlp.config import env_problems

    problems = env_problems()
    if args.otlp:  # --otlp gives the endpoint; the protocol and timeout may still come from the environment
        problems = [p for p in problems if "ENDPOINT" not in p.split("=")[0]]
    if args.otlp_protocol:
        problems = [p for p in problems if "PROTOCOL" not in p.split("=")[0]]
    if problems:
        raise CltraceError(problems[0])
    try:
        return [OtlpSink(endpoint=args.otlp or None, protocol=args.otlp_protocol)]
    except MissingExtraError:
        raise MissingExtraError("--otlp" if args.otlp else "OTEL_EXPORTER_OTLP_ENDPOINT (OTLP export)", "otlp") from None
    except (ValueError, TypeError) as exc:
        raise CltraceError(f"--otlp {args.otlp}: {exc}" if args.otlp else str(exc)) from None


def _native_parts() -> dict[str, str]:
    """Which implementation each native part of the pipeline runs: "native (C extension)" or "python (...)"."""
    from ..export import chrome_lines
    from ..export.perfetto import compress, encoder
    from ..read import scan
    from ..record import callsite, regions
    from ..timeline import passes, stamps, stats

    return {"event stamps": stamps.DETAIL, "event reaper": stamps.REAPER_DETAIL, "resolver passes": passes.DETAIL,
            "statistics": stats.DETAIL, "regions": regions.REGION_DETAIL, "call sites": callsite.CAPTURE_DETAIL,
            "chrome encoder": chrome_lines.DETAIL, "perfetto encoder": encoder.DETAIL,
            "perfetto compressor": compress.DETAIL, "trace scanner": scan.DETAIL}


def cmd_devices(args: argparse.Namespace) -> int:
    import pyopencl as cl

    from ..analyzers.text import plural
    from ..timeline import stamps
    from ..timeline.clock import DeviceClock
    from ..timeline.tracks import device_info
    from ..record.probe import verdict
    from ..record.queues import PROFILING, default_device

    from ..errors import DeviceError
    from ..record.probe import FIX

    try:
        platforms = cl.get_platforms()
    except cl.Error as exc:
        raise DeviceError(f"no OpenCL platform found ({exc}); {FIX}") from None
    try:
        default = default_device().int_ptr
    except Exception:
        default = None
    rows = []
    # --json: stdout is the JSON document alone
    say = (lambda *a, **k: None) if args.json else print
    for pi, p in enumerate(platforms):
        say(f"platform {pi}: {p.name.strip()} ({p.version.strip()})")
        for di, d in enumerate(p.get_devices()):
            prof = bool(d.queue_properties & PROFILING)
            info = device_info(d)
            row = {"index": f"{pi}:{di}", "name": d.name.strip(), "label": info.label, "id": info.uid,
                   "hardware_id": info.hardware_id, "type": cl.device_type.to_string(d.type),
                   "driver": d.driver_version.strip(), "profiling": prof, **verdict(d).as_dict(),
                   "timer_resolution_ns": d.profiling_timer_resolution, "default": d.int_ptr == default,
                   "span_pipeline": stamps.PATH, "native_parts": _native_parts()}
            if prof:
                try:
                    clk = DeviceClock(d, cl.Context([d]), samples=args.samples)
                    for _ in range(2):
                        clk.calibrate()
                    row["clock"] = clk.metadata()
                except Exception as exc:
                    row["clock"] = {"error": str(exc)}
            rows.append(row)
            mark = "*" if row["default"] else " "
            say(f" {mark}{pi}:{di} {info.label} [{row['type']}] driver {row['driver']}")
            say(f"     id: {info.uid}" + ("" if info.hardware_id else " (the driver gives no PCI address or UUID)"))
            say(f"     compiles: {'yes' if row['compiles'] else 'NO: ' + row['compile_error']}")
            say(f"     profiling: {'yes' if prof else 'NO (device times unavailable)'}; "
                  f"timer resolution {row['timer_resolution_ns']} ns")
            c = row.get("clock")
            if c and "error" not in c:
                say(f"     clock: {c['method']}, stamps {c['domain']} time, offset {c['offset_ns']} ns, "
                    f"bound ±{c['bound_ns']} ns over {plural(c['points'], 'calibration')} "
                    f"(drift {c['drift_ns_per_s']} ns/s)")
            elif c:
                say(f"     clock: calibration failed: {c['error']}")
    say(f"span pipeline: {stamps.DETAIL}")
    for part, detail in _native_parts().items():
        say(f"  {part}: {detail}")
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        print("(* = default device; choose another with CLTRACE_DEVICE=gpu|cpu|P:D|name)")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    check_device()
    res = run_demo(out_dir=args.out, steps=args.steps, formats=args.format or FORMATS,
                   extra_sinks=tuple(_otlp_sinks(args)), schedule=args.schedule)
    print(res.report)
    print()
    print(f"loss: {res.losses[0]:.4f} -> {res.losses[-1]:.4f} over {args.steps} steps ({res.seconds:.1f}s)")
    print(res.schedule)
    for p in res.paths:
        print(f"wrote {p}  (open it in https://ui.perfetto.dev)")
    for p in res.cycle_paths:
        print(f"wrote {p}  (one active cycle)")
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    from ..analyzers.report import render
    from ..analyzers.summary import summarize

    why = via_store(args, [args.file])
    if why:
        return summary_via_store(args, why)
    stats, meta = summarize(args.file, window_of(args, steady_default=False))
    if args.json:
        print(json.dumps({"regions": stats.as_dict(), "meta": meta}, indent=2, default=str))
    else:
        w = meta.get("window")
        where = f", {w['label']}{': ' + w['note'] if w.get('note') else ''}" if w else ""
        print(render(stats.as_dict(), meta, title=f"cltrace summary: {args.file}{where}", width=None,
                     sort_by=args.sort, row_limit=args.top or None))
    if meta.get("truncated"):
        from ..read.checks import describe_cut

        sys.stdout.flush()
        print(f"cltrace: warning: {args.file}: {describe_cut(meta['truncated'])}", file=sys.stderr)
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from ..analyzers.analysis import analyze
    from ..analyzers.render import render_analysis
    from ..errors import CltraceError

    if args.store is not None or (args.file is None and os.environ.get("CLTRACE_STORE")):
        if args.file is not None:
            raise CltraceError("analyze takes a FILE or --store STORE, not both")
        from .store import cmd_analyze_store

        no_window_on_store(args)
        return cmd_analyze_store(args)
    if args.file is None:
        raise CltraceError("analyze needs a trace FILE, or --store STORE (or CLTRACE_STORE) for a store")
    why = via_store(args, [args.file])
    if why:
        return analyze_via_store(args, why)
    if args.plot:
        check_plot_path(args.plot)  # before the analysis, not after its report

    a = analyze(args.file, by_shape=args.by_shape, by=args.by, window=window_of(args, steady_default=True))
    if args.json:
        print(a.to_json())
    else:
        print(render_analysis(a, sort=args.sort, top=args.top or None))
    if args.plot:
        from ..analyzers.plot import plot

        print(f"wrote {plot(a, args.plot)}", file=sys.stderr if args.json else sys.stdout)
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from ..analyzers.diff import DEFAULT_PCT, diff_windows

    if args.store is not None:
        from .store import cmd_diff_store

        no_window_on_store(args)
        return cmd_diff_store(args)

    why = via_store(args, [args.a, args.b])
    if why:
        return diff_via_store(args, why)
    from .diff_report import print_diff

    pct = DEFAULT_PCT if args.fail_above is None else args.fail_above
    rows, wa, wb = diff_windows(args.a, args.b, pct, window_of(args, steady_default=False))
    return print_diff(rows, args.a, args.b, pct, args, windows=(wa, wb))


def _png(value: str) -> str:
    if not value.lower().endswith(".png"):
        raise argparse.ArgumentTypeError(f"{value!r}: the plot is a PNG file, name it *.png")
    return value


def add_analysis_commands(sub: Any) -> None:
    """``cltrace analyze`` and ``cltrace diff``."""
    from ..analyzers.diff import DEFAULT_PCT
    from ..analyzers.kernels import GROUPS, SORT_KEYS
    from .store import add_scope_arguments, add_store_argument

    a = sub.add_parser("analyze", help="where the time went: utilisation, idle causes, kernels, launches, findings; "
                                       "with --store, across the ranks of a store")
    a.add_argument("file", nargs="?", help="trace file (.json or .pftrace); or --store")
    add_store_argument(a)
    add_scope_arguments(a)
    a.add_argument("--json", action="store_true", help="print the analysis as JSON (schema cltrace.analysis/1)")
    a.add_argument("--plot", metavar="FILE.png", type=_png, help="also draw utilisation over time and top kernels")
    a.add_argument("--sort", choices=SORT_KEYS, default="total", help="order of the kernel table (default: total)")
    a.add_argument("--top", type=whole_number(0), default=10, metavar="N", help="kernels to list (default 10; 0: all)")
    a.add_argument("--by-shape", action="store_true", help="group kernels by name and launch shape")
    a.add_argument("--by", choices=GROUPS, default=None,
                   help="group kernels by name and also launch shape or call site (the user's launching line)")
    add_window_arguments(a, steady_default=True)
    add_size_arguments(a)
    a.set_defaults(fn=cmd_analyze)

    d = sub.add_parser("diff", help="compare two traces (or two runs in a store) per region and kernel; "
                                    "gate CI with --fail-above")
    d.add_argument("a", help="the baseline trace (.json or .pftrace); with --store, the baseline run id")
    d.add_argument("b", help="the trace to compare with it; with --store, a run id")
    add_store_argument(d)
    d.add_argument("--fail-above", type=percent, metavar="PCT",
                   help="exit 1 on a regression above PCT percent: the run's device time, a region or a kernel "
                        "slower beyond the runs' spread, or a new kernel taking more than PCT%% of A's device time "
                        f"(without it rows are judged at {DEFAULT_PCT:g}%% and nothing fails)")
    d.add_argument("--top", type=whole_number(0), default=20, metavar="N", help="rows to list (default 20; 0: all)")
    d.add_argument("--json", action="store_true", help="print the rows as JSON")
    add_window_arguments(d, steady_default=False)
    add_size_arguments(d)
    d.set_defaults(fn=cmd_diff)


def run_outputs(script: str, outs: Sequence[str] | None, formats: Sequence[str] | None) -> list[str]:
    """The trace files of ``cltrace run``: each ``--out`` in each ``--format`` (the format's suffix
    in place of the path's own), ``--out`` alone (format from its suffix), or else
    ``traces/<script>.<format>``."""
    if not outs:
        base = os.path.join("traces", os.path.splitext(os.path.basename(script))[0])
        return [f"{base}.{fmt}" for fmt in formats or FORMATS]
    if not formats:
        return list(outs)
    paths: list[str] = []
    for out in outs:
        root, ext = os.path.splitext(out)
        base = root if ext[1:] in FORMATS else out
        paths += [p for p in (f"{base}.{fmt}" for fmt in formats) if p not in paths]
    return paths


def cmd_run(args: argparse.Namespace) -> int:
    from ..errors import CltraceError
    from .run import module_file, run_script

    if args.module is not None:  # -m MODULE args...: as python -m; traces named after the module's last part
        if not args.module or args.script:
            raise CltraceError("-m needs the module to run, and no script: "
                               "cltrace run [options] -m package.module [args...]")
        target, *argv = args.module
        try:
            module_file(target)
        except ImportError as exc:
            raise CltraceError(f"-m {target}: {exc}") from None
        except Exception as exc:  # its package's __init__ failed, as python -m would show
            raise CltraceError(f"-m {target}: finding the module failed: {type(exc).__name__}: {exc}") from None
        stem = target.rpartition(".")[2] + ".py"
    else:
        if not args.script:
            raise CltraceError("run needs the script to trace: cltrace run [options] script.py [args...] "
                               "(or -m package.module [args...])")
        if not os.path.isfile(args.script):
            raise CltraceError(f"cannot open the script {args.script!r}: no such file")
        target, argv, stem = args.script, list(args.args), args.script
    if os.environ.get("CLTRACE_DEVICE"):
        check_device()
    if args.steps_from and args.schedule is None:
        raise CltraceError(f"--steps-from {args.steps_from} needs --schedule, e.g. --schedule wait=1,warmup=1,active=3")
    outs = run_outputs(stem, args.out, args.format)
    return run_script(target, argv, outs, extra_sinks=_otlp_sinks(args), quiet=args.quiet, schedule=args.schedule,
                      steps_from=args.steps_from, merge_at_exit=True, module=args.module is not None)


def _merged_out(value: str) -> str:
    if not value.endswith((".json", ".pftrace")) or value.endswith(".speedscope.json"):
        raise argparse.ArgumentTypeError(f"{value!r}: the merged trace is a .json or .pftrace file")
    return value


def cmd_merge(args: argparse.Namespace) -> int:
    from ..merge import merge

    result = merge(args.files, args.out)
    print(f"cltrace: wrote {args.out}: {len(result.processes)} processes, {result.spans:,} spans on one timeline")
    for line in result.lines():
        print(line)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from ..analyzers.report import SORT_KEYS as REPORT_SORT_KEYS

    p = _Parser(prog="cltrace", description="Where the time of OpenCL programs goes.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", help="what to do")

    d = sub.add_parser("devices", help="list OpenCL devices, profiling support and clock calibration")
    d.add_argument("--samples", type=whole_number(1), default=64, help="marker samples per calibration (default 64)")
    d.add_argument("--json", action="store_true", help="print the details as JSON only")
    d.set_defaults(fn=cmd_devices)

    def add_outputs(sp: argparse.ArgumentParser, default_formats: str) -> None:
        sp.add_argument("--format", type=_formats, default=None,
                        help=f"comma-separated trace formats ({', '.join(FORMATS)}; default {default_formats})")
        sp.add_argument("--otlp", metavar="ENDPOINT",
                        help="also send spans to an OTLP collector (https://HOST:PORT or a bare HOST:PORT: TLS; "
                             "http://HOST:PORT: plain text; default: OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT if set; "
                             "headers, timeout and protocol from the other OTEL_EXPORTER_OTLP_* variables)")
        sp.add_argument("--otlp-protocol", choices=("grpc", "http/protobuf"), default=None,
                        help="OTLP protocol (default: from OTEL_EXPORTER_OTLP_PROTOCOL, else grpc)")

    dm = sub.add_parser("demo", help="train a tiny MLP with OpenCL kernels, traced")
    dm.add_argument("--out", default="traces", help="directory for demo.<format> (default: traces)")
    dm.add_argument("--steps", type=whole_number(1), default=40, help="training steps (default 40)")
    dm.add_argument("--schedule", type=_schedule, metavar="K=N,...",
                    help="which steps to trace (default: two cycles of warmup=1 and the rest active)")
    add_outputs(dm, "json,pftrace")
    dm.set_defaults(fn=cmd_demo)

    s = sub.add_parser("summary", help="region/kernel report of a trace file (.json or .pftrace)")
    s.add_argument("file", help="a trace written by cltrace (.json or .pftrace)")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    add_window_arguments(s, steady_default=False)
    s.add_argument("--sort", choices=REPORT_SORT_KEYS, default="total",
                   help="order of each level of the tree, largest first (default: total)")
    s.add_argument("--top", type=whole_number(0), default=0, metavar="N",
                   help="only the N regions and commands largest by --sort, with the regions around them "
                        "(default 0: all)")
    add_size_arguments(s)
    s.set_defaults(fn=cmd_summary)

    add_analysis_commands(sub)
    from .store import add_load_command

    add_load_command(sub)

    r = sub.add_parser("run", help="trace an unmodified pyopencl script: cltrace run script.py [args...]")
    r.add_argument("--out", action="append",
                   help="trace file (repeatable; format from its suffix, or each --format next to it)")
    add_outputs(r, "json,pftrace")
    r.add_argument("--quiet", action="store_true", help="do not print where the trace files are")
    r.add_argument("--schedule", type=_schedule, metavar="K=N,...",
                   help="trace only some steps: skip_first=10,wait=1,warmup=1,active=3,repeat=2; the script "
                        "marks steps with cltrace.step() (or see --steps-from); one file per active cycle")
    r.add_argument("--steps-from", metavar="REGION",
                   help="with --schedule: each outermost occurrence of the cltrace region REGION is a step")
    r.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE [ARGS]",
                   help="run a module as `python -m MODULE args...` would (the last option: the rest is its own)")
    r.add_argument("script", nargs="?", help="the Python script to run, as `python script.py` would")
    r.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    r.set_defaults(fn=cmd_run)

    m = sub.add_parser("merge", help="merge traces of several processes into one: a process per pid, one timeline")
    m.add_argument("files", nargs="+", help="trace files written by cltrace (.json or .pftrace, mixed)")
    m.add_argument("-o", "--out", required=True, type=_merged_out, help="the merged trace (.json or .pftrace)")
    m.set_defaults(fn=cmd_merge)

    from .open_ui import add_open_command

    add_open_command(sub, port)

    try:
        from .tune import add_tune_arguments, main_tune
    except ImportError:
        pass
    else:
        t = sub.add_parser("tune", help="autotune the tiled matmul example on the default device")
        add_tune_arguments(t)
        t.set_defaults(fn=main_tune)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from ..errors import CltraceError

    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except CltraceError as exc:
        print(f"cltrace: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())

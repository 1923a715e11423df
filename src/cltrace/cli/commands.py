"""The ``cltrace`` command: devices, demo, summary, run, tune."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

FORMATS = ("json", "pftrace")


def _formats(value: str) -> tuple[str, ...]:
    fmts = tuple(f.strip() for f in value.split(",") if f.strip())
    bad = [f for f in fmts if f not in FORMATS]
    if bad or not fmts:
        raise argparse.ArgumentTypeError(f"unknown format(s) {bad}: choose from {', '.join(FORMATS)}")
    return fmts


def _otlp_sinks(args: argparse.Namespace) -> list[Any]:
    if not getattr(args, "otlp", None):
        return []
    from ..export.otlp import OtlpSink

    return [OtlpSink(endpoint=args.otlp, protocol=args.otlp_protocol)]


def cmd_devices(args: argparse.Namespace) -> int:
    import pyopencl as cl

    from ..timeline import stamps
    from ..timeline.clock import DeviceClock
    from ..timeline.tracks import device_info
    from ..record.queues import PROFILING, default_device

    try:
        platforms = cl.get_platforms()
    except cl.Error as exc:
        print(f"cltrace: no OpenCL platform: {exc}", file=sys.stderr)
        return 1
    try:
        default = default_device().int_ptr
    except Exception:
        default = None
    rows = []
    for pi, p in enumerate(platforms):
        print(f"platform {pi}: {p.name.strip()} ({p.version.strip()})")
        for di, d in enumerate(p.get_devices()):
            prof = bool(d.queue_properties & PROFILING)
            info = device_info(d)
            row = {"index": f"{pi}:{di}", "name": d.name.strip(), "label": info.label, "id": info.uid,
                   "hardware_id": info.hardware_id, "type": cl.device_type.to_string(d.type),
                   "driver": d.driver_version.strip(), "profiling": prof,
                   "timer_resolution_ns": d.profiling_timer_resolution, "default": d.int_ptr == default,
                   "span_pipeline": stamps.PATH}
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
            print(f" {mark}{pi}:{di} {info.label} [{row['type']}] driver {row['driver']}")
            print(f"     id: {info.uid}" + ("" if info.hardware_id else " (the driver gives no PCI address or UUID)"))
            print(f"     profiling: {'yes' if prof else 'NO (device times unavailable)'}; "
                  f"timer resolution {row['timer_resolution_ns']} ns")
            c = row.get("clock")
            if c and "error" not in c:
                print(f"     clock: {c['method']}, stamps {c['domain']} time, offset {c['offset_ns']} ns, "
                      f"bound ±{c['bound_ns']} ns over {c['points']} calibrations (drift {c['drift_ns']} ns)")
            elif c:
                print(f"     clock: calibration failed: {c['error']}")
    print(f"span pipeline: {stamps.DETAIL}")
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    print("(* = default device; choose another with CLTRACE_DEVICE=gpu|cpu|P:D|name)")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    res = run_demo(out_dir=args.out, steps=args.steps, formats=args.format, extra_sinks=tuple(_otlp_sinks(args)))
    print(res.report)
    print()
    print(f"loss: {res.losses[0]:.4f} -> {res.losses[-1]:.4f} over {args.steps} steps ({res.seconds:.1f}s)")
    for p in res.paths:
        print(f"wrote {p}  (open it in https://ui.perfetto.dev)")
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    from ..analyze.report import render
    from ..analyze.summary import summarize

    stats, meta = summarize(args.file)
    if args.json:
        print(json.dumps({"regions": stats.as_dict(), "meta": meta}, indent=2, default=str))
    else:
        print(render(stats.as_dict(), meta, title=f"cltrace summary: {args.file}"))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .run import run_script

    outs = list(args.out or [])
    if not outs:
        base = os.path.splitext(os.path.basename(args.script))[0]
        outs = [os.path.join("traces", f"{base}.{fmt}") for fmt in args.format]
    return run_script(args.script, list(args.args), outs, extra_sinks=_otlp_sinks(args))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cltrace", description="Where the time of OpenCL programs goes.")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("devices", help="list OpenCL devices, profiling support and clock calibration")
    d.add_argument("--samples", type=int, default=64, help="marker samples per calibration")
    d.add_argument("--json", action="store_true", help="also print the details as JSON")
    d.set_defaults(fn=cmd_devices)

    def add_outputs(sp: argparse.ArgumentParser, default_formats: str) -> None:
        sp.add_argument("--format", type=_formats, default=_formats(default_formats),
                        help=f"comma-separated trace formats ({', '.join(FORMATS)})")
        sp.add_argument("--otlp", metavar="ENDPOINT", help="also send spans to an OTLP collector")
        sp.add_argument("--otlp-protocol", choices=("grpc", "http/protobuf"), default=None,
                        help="OTLP protocol (default: from OTEL_EXPORTER_OTLP_PROTOCOL, else grpc)")

    dm = sub.add_parser("demo", help="train a tiny MLP with OpenCL kernels, traced")
    dm.add_argument("--out", default="traces", help="directory for demo.<format> (default: traces)")
    dm.add_argument("--steps", type=int, default=40)
    add_outputs(dm, "json,pftrace")
    dm.set_defaults(fn=cmd_demo)

    s = sub.add_parser("summary", help="region/kernel report of a trace file (.json or .pftrace)")
    s.add_argument("file")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.set_defaults(fn=cmd_summary)

    r = sub.add_parser("run", help="trace an unmodified pyopencl script: cltrace run script.py [args...]")
    r.add_argument("--out", action="append", help="trace file (repeatable; format from suffix)")
    add_outputs(r, "json,pftrace")
    r.add_argument("script")
    r.add_argument("args", nargs=argparse.REMAINDER)
    r.set_defaults(fn=cmd_run)

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

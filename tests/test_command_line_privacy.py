"""Secrets in the command line stay out of every output: the values of secret-looking arguments read
``***`` in the JSON ``process_name``, the Perfetto process descriptor (read back) and OTLP's
``process.command_args`` (through a real collector), and ``CLTRACE_COMMAND_LINE=off`` /
``cltrace.configure(command_line="off")`` leaves the arguments out."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

import cltrace
from cltrace.export import processes
from cltrace.read.perfetto import iter_packets
from otlp_collector import RotelCollector

SECRETS = ["hunter2pw", "k3yv4lue", "t0kenv4l", "s3cr3tv4l", "pa55url"]
ARGS = ["--password=hunter2pw", "--api-key", "k3yv4lue", "DB_TOKEN=t0kenv4l", "model.client_secret=s3cr3tv4l",
        "--db", "postgres://me:pa55url@db:5432/x", "--epochs", "3"]
SHOWN = ["--password=***", "--api-key", "***", "DB_TOKEN=***", "model.client_secret=***",
         "--db", "postgres://me:***@db:5432/x", "--epochs", "3"]


@pytest.mark.parametrize("args, shown", [
    (ARGS, SHOWN),
    (["--PASSWD", "x", "--Auth-Token=y", "--credentials", "z", "--secret", "--verbose"],
     ["--PASSWD", "***", "--Auth-Token=***", "--credentials", "***", "--secret", "--verbose"]),
    (["--lr=0.1", "batch=32", "-v", "--name", "run-1", "https://example.com/x"],
     ["--lr=0.1", "batch=32", "-v", "--name", "run-1", "https://example.com/x"]),
])
def test_secret_looking_values_are_redacted_and_the_rest_kept(args: list[str], shown: list[str]) -> None:
    assert processes.redact(["train.py", *args]) == ["train.py", *shown]


@pytest.fixture(scope="module")
def collector() -> Iterator[RotelCollector]:
    with RotelCollector() as col:
        yield col


def _run(tmp_path: Path, collector: RotelCollector, **env_extra: str) -> tuple[str, str]:
    """``cltrace run`` of a script given ``ARGS``, into s.json, s.pftrace and the collector; returns the
    service name and the script's path."""
    service = f"secrets-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "s.py"
    script.write_text("import cltrace\nwith cltrace.region('work'):\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLTRACE", "OTEL_"))}
    env.update(OTEL_SERVICE_NAME=service, **env_extra)
    p = subprocess.run([sys.executable, "-m", "cltrace", "run", "--out", "s.json", "--format", "json,pftrace",
                        "--otlp", collector.grpc_endpoint, "s.py", *ARGS], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return service, "s.py"


def _outputs(tmp_path: Path, collector: RotelCollector, service: str) -> tuple[str, str, str, dict[str, Any]]:
    """The JSON process name and whole file, the Perfetto process name and whole (expanded) trace, and the
    OTLP resource the collector received."""
    text = (tmp_path / "s.json").read_text()
    events = [json.loads(line.rstrip().rstrip(",")) for line in text.splitlines() if line.startswith("{")]
    (json_name,) = [e["args"]["name"] for e in events
                    if e.get("name") == "process_name" and not e["args"]["name"].startswith("OpenCL")]
    packets = iter_packets((tmp_path / "s.pftrace").read_bytes())
    expanded = b"".join(raw for _, raw in packets)
    descs = [pb.TracePacket.FromString(raw).track_descriptor for _, raw in packets]
    (pf_name,) = [d.process.process_name for d in descs if d.HasField("process")
                  and not d.process.process_name.startswith("OpenCL")]
    got = collector.wait_for(lambda spans: any(s["resource"].get("service.name") == service for s in spans))
    resource = next(s["resource"] for s in got if s["resource"].get("service.name") == service)
    return json_name, text, pf_name, {"resource": resource, "bytes": expanded}


def test_every_output_shows_the_command_line_redacted(tmp_path: Path, collector: RotelCollector) -> None:
    service, script = _run(tmp_path, collector)
    json_name, text, pf_name, otlp = _outputs(tmp_path, collector, service)
    exe = os.path.basename(sys.executable)
    assert json_name == pf_name == " ".join([exe, script, *SHOWN])
    assert otlp["resource"]["process.command_args"] == [script, *SHOWN]
    for secret in SECRETS:
        assert secret not in text and secret.encode() not in otlp["bytes"], secret
        assert secret not in str(otlp["resource"]), secret
    assert not [ln for ln in collector.output().splitlines() if any(s in ln for s in SECRETS)]


def test_command_line_off_leaves_the_arguments_out_of_every_output(tmp_path: Path,
                                                                   collector: RotelCollector) -> None:
    service, _ = _run(tmp_path, collector, CLTRACE_COMMAND_LINE="off")
    json_name, text, pf_name, otlp = _outputs(tmp_path, collector, service)
    assert json_name == pf_name == f"{os.path.basename(sys.executable)} s.py"
    assert "process.command_args" not in otlp["resource"]
    for arg in ["--epochs", "--api-key", *SECRETS]:
        assert arg not in text and arg.encode() not in otlp["bytes"] and arg not in str(otlp["resource"]), arg


def test_configure_command_line_off_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "train.py"), "--token", "t0kenv4l"])
    monkeypatch.setattr(processes, "_mode", None)  # restored after the test
    monkeypatch.setenv("CLTRACE_COMMAND_LINE", "redacted")
    cltrace.configure(command_line="off")  # over the variable
    with cltrace.trace(tmp_path / "t.json", quiet=True):
        with cltrace.region("r"):
            pass
    text = (tmp_path / "t.json").read_text()
    events = [json.loads(line.rstrip().rstrip(",")) for line in text.splitlines() if line.startswith("{")]
    names = [e["args"]["name"] for e in events if e.get("name") == "process_name"]
    assert f"{os.path.basename(sys.orig_argv[0])} train.py" in names
    assert "t0kenv4l" not in text and "--token" not in text
    with pytest.raises(ValueError, match="command_line='none'.*'redacted', 'off'"):
        cltrace.configure(command_line="none")


def test_an_unknown_setting_leaves_the_command_line_out_with_one_warning(monkeypatch: pytest.MonkeyPatch,
                                                                        caplog: Any) -> None:
    monkeypatch.setattr(sys, "argv", ["train.py", "--api-key", "k3yv4lue"])
    monkeypatch.setattr(processes, "_mode", None)
    monkeypatch.setattr(processes, "_warned", False)
    monkeypatch.setenv("CLTRACE_COMMAND_LINE", "hide")
    with caplog.at_level("WARNING", logger="cltrace"):
        assert processes.command_args() is None and processes.command_args() is None
        assert processes.program_name().endswith(" train.py")
    (line,) = [r.getMessage() for r in caplog.records if r.name == "cltrace"]
    assert "CLTRACE_COMMAND_LINE='hide'" in line and "left out" in line and "redacted or off" in line

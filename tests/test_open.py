"""``cltrace open FILE``: the file served once on 127.0.0.1 with the CORS header ui.perfetto.dev needs,
the UI's URL handed to the browser (or printed), the server gone once the file was fetched. Real
sockets, a real HTTP client; the "browser" is a program named by ``BROWSER`` that fetches the URL's
file as the UI would, so no browser opens."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import unquote

import pytest

from cltrace.cli.open_ui import UI, serve_once, ui_url

FETCHER = r'''
import os, sys, urllib.request
url = sys.argv[1]
assert url.startswith("https://ui.perfetto.dev/#!/?url="), url
local = url.split("?url=", 1)[1]
req = urllib.request.Request(local, headers={"Origin": "https://ui.perfetto.dev"})
with urllib.request.urlopen(req, timeout=30) as r:
    body = r.read()
    cors = r.headers["Access-Control-Allow-Origin"]
with open(os.environ["SEEN"], "wb") as fh:
    fh.write(cors.encode() + b"\n" + url.encode() + b"\n" + body)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "cltrace", "open", *args], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, **(env or {})))


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "my run.json"  # a space: the URL quotes the name
    path.write_text('[{"ph": "i", "name": "x", "ts": 0, "pid": 1, "tid": 1}]\n')
    return path


def test_serves_the_file_once_with_the_cors_header_then_stops(tmp_path: Path, trace_file: Path) -> None:
    port = free_port()
    proc = start(tmp_path, str(trace_file), "--port", str(port), "--no-browser")
    try:
        serving = proc.stdout.readline()
        assert serving.startswith(f"cltrace: serving {trace_file} on http://127.0.0.1:{port}/"), serving
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        assert lines[0].startswith("cltrace: note: ui.perfetto.dev's content policy lets it fetch from port 9001")
        url = lines[1].split("cltrace: open ", 1)[1].strip()
        assert url == f"https://ui.perfetto.dev/#!/?url=http://127.0.0.1:{port}/my%20run.json"
        with pytest.raises(urllib.error.HTTPError) as miss:  # the UI probing for a trace processor
            urllib.request.urlopen(f"http://127.0.0.1:{port}/status", data=b"", timeout=30)
        assert miss.value.code == 404 and miss.value.headers["Access-Control-Allow-Origin"] == UI
        assert proc.poll() is None  # still waiting for the file
        with urllib.request.urlopen(url.split("?url=", 1)[1], timeout=30) as r:
            assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == "https://ui.perfetto.dev"
            assert r.read() == trace_file.read_bytes()
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert f"the UI fetched {trace_file} ({trace_file.stat().st_size} bytes); server stopped" in out


def test_the_browser_gets_the_ui_url_and_its_fetch_ends_the_server(tmp_path: Path, trace_file: Path) -> None:
    fetcher = tmp_path / "fetcher"  # webbrowser runs BROWSER as one program, given the URL
    fetcher.write_text(f"#!{sys.executable}\n{FETCHER}")
    fetcher.chmod(0o755)
    seen = tmp_path / "seen"
    port = free_port()
    proc = start(tmp_path, str(trace_file), "--port", str(port), env={"BROWSER": str(fetcher), "SEEN": str(seen)})
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    cors, url, body = seen.read_bytes().split(b"\n", 2)
    assert cors == b"https://ui.perfetto.dev" and body == trace_file.read_bytes()
    assert url.decode() == ui_url("my run.json", port) and f"cltrace: open {url.decode()}\n" in out
    assert "no browser" not in out


def test_a_busy_port_is_one_line_and_exit_2(tmp_path: Path, trace_file: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = start(tmp_path, str(trace_file), "--port", str(port), "--no-browser")
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cltrace: error: port {port} on 127.0.0.1 is in use"), err
    assert "--port" in lines[0]


@pytest.mark.parametrize("args, says", [
    (["missing.json"], "missing.json: no such file"),
    (["x.speedscope.json"], "speedscope.app"),
    (["t.json", "--port", "0"], "--port"),
    (["t.json", "--port", "70000"], "--port"),
])
def test_open_mistakes_are_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    (tmp_path / "t.json").write_text("[]")
    (tmp_path / "x.speedscope.json").write_text("{}")
    proc = start(tmp_path, *args, "--no-browser")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("cltrace: error: ") and says in err, err


def test_serve_once_answers_one_fetch_in_process(trace_file: Path) -> None:
    port = free_port()
    got: dict[str, object] = {}
    ready = threading.Event()

    def serve() -> None:
        got["sent"] = serve_once(str(trace_file), port, lambda url: (got.update(url=url), ready.set()))

    t = threading.Thread(target=serve)
    t.start()
    assert ready.wait(30)
    local = str(got["url"]).split("?url=", 1)[1]
    assert unquote(local.rsplit("/", 1)[1]) == trace_file.name
    with urllib.request.urlopen(local, timeout=30) as r:
        assert r.read() == trace_file.read_bytes()
    t.join(30)
    assert not t.is_alive() and got["sent"] == trace_file.stat().st_size


def test_ctrl_c_stops_the_server_with_one_line(tmp_path: Path, trace_file: Path) -> None:
    import signal

    port = free_port()
    proc = start(tmp_path, str(trace_file), "--port", str(port), "--no-browser")
    try:
        for line in proc.stdout:  # until the URL is printed: the server is listening
            if line.startswith("cltrace: open "):
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and err == f"cltrace: stopped; {trace_file} was not fetched\n", err
    with socket.socket() as again:  # the port is free again
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))

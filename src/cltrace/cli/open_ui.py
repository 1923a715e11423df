"""``cltrace open FILE``: the trace in ui.perfetto.dev, from the command line.

As Perfetto's own ``tools/open_trace_in_ui`` does it: the file is served once on 127.0.0.1:9001 (the
one local origin the UI's content policy lets it fetch from) with the CORS header the UI needs, the
browser opens ``https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/<name>``, and the server stops
once the file has been fetched (or on Ctrl-C). Other requests (the UI probes the port for a
trace processor) get a 404 and the server keeps waiting. Nothing leaves the machine but the URL.
"""
from __future__ import annotations

import errno
import http.server
import os
import shutil
import sys
import threading
import webbrowser
from typing import Any, Callable
from urllib.parse import quote, unquote

from ..errors import CltraceError

UI = "https://ui.perfetto.dev"
HOST = "127.0.0.1"
PORT = 9001  # the port ui.perfetto.dev's content security policy allows (it is trace_processor's too)


def ui_url(name: str, port: int = PORT) -> str:
    """The URL that makes the UI fetch ``name`` from the local server."""
    return f"{UI}/#!/?url=http://{HOST}:{port}/{quote(name)}"


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves the one file at ``/<name>`` with the CORS header; 404 for anything else."""

    server: "_OneFile"

    def end_headers(self) -> None:
        self.send_header("Access-Control-Allow-Origin", UI)
        self.send_header("Cache-Control", "no-cache")
        super().end_headers()

    def do_GET(self) -> None:  # noqa: N802 (the http.server name)
        srv = self.server
        if unquote(self.path.split("?", 1)[0]) != "/" + srv.name:
            self.send_error(404, "File not found")
            return
        with open(srv.file, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            self.send_response(200)
            self.send_header("Content-Type", "application/json" if srv.name.endswith(".json")
                             else "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            shutil.copyfileobj(fh, self.wfile)
        srv.served = size

    def do_POST(self) -> None:  # noqa: N802 - the UI asks for a trace processor's RPC: there is none here
        self.send_error(404, "File not found")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - one line at the end instead
        pass


class _OneFile(http.server.HTTPServer):
    allow_reuse_address = True  # a port left in TIME_WAIT by the last run; a listening one is still refused

    def __init__(self, path: str, port: int) -> None:
        self.file = path
        self.name = os.path.basename(path)
        self.served: int | None = None
        super().__init__((HOST, port), _Handler)


def serve_once(path: str, port: int = PORT, ready: Callable[[str], None] | None = None) -> int:
    """Serve ``path`` on 127.0.0.1:``port`` until it has been fetched once; return the bytes sent.
    ``ready(url)`` is called once the port is listening (with the UI's URL). A port in use raises
    ``CltraceError``."""
    try:
        server = _OneFile(path, port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise CltraceError(f"port {port} on {HOST} is in use (another `cltrace open`, or a trace_processor "
                               "--httpd?): stop it, or serve on another with --port N") from None
        raise CltraceError(f"cannot serve on {HOST}:{port}: {exc.strerror or exc}; choose another --port") from None
    with server:
        if ready is not None:
            ready(ui_url(server.name, port))
        while server.served is None:
            server.handle_request()
        return server.served


def _browse(url: str) -> None:
    """Start the browser at ``url``; where none can be started, say to open the URL printed above."""
    try:
        opened = webbrowser.open_new_tab(url)
    except webbrowser.Error:
        opened = False
    if not opened:
        print("cltrace: no browser could be started: open the URL above in one", flush=True)


def cmd_open(args: Any) -> int:
    """``cltrace open FILE [--port N] [--no-browser]``."""
    path = os.path.abspath(args.file)
    if not os.path.isfile(path):
        raise CltraceError(f"{args.file}: {'is a directory' if os.path.isdir(path) else 'no such file'}")
    if path.endswith(".speedscope.json"):
        raise CltraceError(f"{args.file}: a speedscope profile: open it in https://www.speedscope.app "
                           "(ui.perfetto.dev opens the .json/.pftrace traces)")

    def ready(url: str) -> None:
        print(f"cltrace: serving {args.file} on http://{HOST}:{args.port}/ until the UI fetches it (Ctrl-C stops)")
        if args.port != PORT:
            print(f"cltrace: note: ui.perfetto.dev's content policy lets it fetch from port {PORT} only; "
                  f"port {args.port} suits a UI of your own or a fetch by hand")
        print(f"cltrace: open {url}", flush=True)
        if args.browser:  # in a thread: a browser program may not return before its fetch is served
            threading.Thread(target=_browse, args=(url,), name="cltrace-open-browser", daemon=True).start()

    try:
        sent = serve_once(path, args.port, ready)
    except KeyboardInterrupt:
        print(f"cltrace: stopped; {args.file} was not fetched", file=sys.stderr)
        return 130
    print(f"cltrace: the UI fetched {args.file} ({sent:,} bytes); server stopped")
    return 0


def add_open_command(sub: Any, port_type: Callable[[str], int]) -> None:
    o = sub.add_parser("open", help="open a trace in ui.perfetto.dev: serve it once on 127.0.0.1:9001 and "
                                    "point the browser at it")
    o.add_argument("file", help="the trace to open (.json or .pftrace)")
    o.add_argument("--port", type=port_type, default=PORT,
                   help=f"port to serve on (default {PORT}, the only one ui.perfetto.dev fetches from)")
    o.add_argument("--no-browser", dest="browser", action="store_false",
                   help="do not start a browser: print the URL to open (on another machine, with the port "
                        "forwarded)")
    o.set_defaults(fn=cmd_open)

"""ClickHouse's HTTP interface in front of an embedded (chDB) store, for collectors in tests.

A collector's ClickHouse exporter (rotel's, here) POSTs ``INSERT INTO t (cols) FORMAT RowBinary``
with the rows as the body. ``ClickHouseFront`` writes the body to a file and runs
``INSERT INTO t (cols) SELECT * FROM file(path, RowBinary, structure)`` in the store, the structure
being the table's own types of those columns: the rows land exactly as the collector encoded them.
Other queries (a ping, a SELECT) are run as they are. Loopback only; stop() or leave the block.
"""
from __future__ import annotations

import http.server
import os
import re
import tempfile
import threading
import urllib.parse
from typing import Any

_INSERT = re.compile(r"^\s*INSERT\s+INTO\s+([\w.`\"]+)\s*\(([^)]*)\)\s*FORMAT\s+RowBinary\s*$", re.I | re.S)


class ClickHouseFront:
    def __init__(self, client: Any, database: str) -> None:
        self.client = client
        self.database = database
        self.lock = threading.Lock()
        self.inserts = 0
        self.errors: list[str] = []
        self.dir = tempfile.mkdtemp(prefix="cltrace-chfront-")
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().strip().split(b";")[0], 16)
                        if not size:
                            self.rfile.readline()
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _answer(self, code: int, text: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def do_GET(self) -> None:
                self._answer(200, b"Ok.\n")

            def do_POST(self) -> None:
                params = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                body = self._body()
                query = params.get("query", [""])[0]
                if not query:
                    query, body = body.decode("utf-8"), b""
                try:
                    front.run(query, body, params.get("database", [front.database])[0])
                except Exception as exc:  # the collector gets ClickHouse's kind of answer: 500 and the text
                    front.errors.append(str(exc))
                    self._answer(500, str(exc).encode())
                    return
                self._answer(200, b"")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def run(self, query: str, body: bytes, database: str) -> None:
        m = _INSERT.match(query)
        with self.lock:
            if not m:
                self.client.command(query)
                return
            table = m.group(1).replace("`", "").replace('"', "")
            if "." not in table:
                table = f"{database}.{table}"
            cols = [c.strip().strip("`") for c in m.group(2).split(",")]
            db, name = table.split(".", 1)
            types = dict(self.client.query(
                "SELECT name, type FROM system.columns WHERE database = {d:String} AND table = {t:String}",
                parameters={"d": db, "t": name}).result_rows)
            structure = ", ".join(f"`{c}` {types[c]}" for c in cols)
            path = os.path.join(self.dir, f"insert{self.inserts}.bin")
            with open(path, "wb") as fh:
                fh.write(body)
            self.inserts += 1
            quoted = ", ".join(f"`{c}`" for c in cols)
            self.client.command(f"INSERT INTO {db}.{name} ({quoted}) SELECT * FROM file('{path}', 'RowBinary', "
                                f"'{structure}')")

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "ClickHouseFront":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

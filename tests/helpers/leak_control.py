"""Controls for the load test's memory check: an HTTP server that answers like llama-server's
/health and /completion and either leaks a fixed amount per request or fills a bounded cache
in a few steps. `memory_verdict` must flag the first and pass the second (tests/proof/test_load.py).

    LeakyServer(log_path, leak_kib=..., cache_step_kib=...)   .port, .owned, close()
    python tests/helpers/leak_control.py PORT LEAK_KIB STEP_KIB STEP_AT,...
"""

from __future__ import annotations

import http.server
import json
import sys
from pathlib import Path

from llamacpp_mla_port.proof.run.processes import LOCALHOST, Owned, free_port


class LeakyServer:
    """The control server in its own process, on a free loopback port; `close()` stops it."""

    def __init__(self, log_path: Path, leak_kib: float = 0.0, cache_step_kib: int = 0,
                 cache_steps_at: tuple[int, ...] = (), load_timeout: float = 30):
        self.port = free_port()
        at = ",".join(str(a) for a in cache_steps_at) or "-"
        self.cmd = [sys.executable, str(Path(__file__).resolve()), str(self.port), str(leak_kib),
                    str(cache_step_kib), at]
        self.owned = Owned(self.cmd, log_path, name="leak-control")
        try:
            self.owned.wait_http(f"http://{LOCALHOST}:{self.port}/health", seconds=load_timeout)
        except BaseException:
            self.owned.stop()
            raise

    def close(self) -> None:
        self.owned.stop()


def _serve(port: int, leak_kib: float, step_kib: int, steps_at: set[int]) -> None:
    kept: list[bytearray] = []          # what leaks (or what the bounded cache holds)
    count = [0]

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._send(200, b'{"status":"ok"}')

        def do_POST(self) -> None:
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            count[0] += 1
            if leak_kib:
                kept.append(bytearray(int(leak_kib * 1024)))       # zero-filled: the pages are touched
            if count[0] in steps_at:
                kept.append(bytearray(step_kib * 1024))
            if not req.get("stream"):
                self._send(200, json.dumps({"content": "x" * 8, "timings": {}}).encode())
                return
            chunks = [{"content": "x", "stop": False}] * 4 + [{"content": "", "stop": True}]
            body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
            try:
                self._send(200, body, "text/event-stream")
            except OSError:
                pass                        # the client closed a cancelled stream

    http.server.HTTPServer((LOCALHOST, port), Handler).serve_forever()      # one thread: no arena noise


if __name__ == "__main__":
    _port, _leak, _step, _at = sys.argv[1:5]
    _serve(int(_port), float(_leak), int(_step), set() if _at == "-" else {int(a) for a in _at.split(",")})

"""A fake OpenAI-compatible streaming server for benchmark tests: no model, each
token is a sleep. Servers that share a `Machine` also share its drift: every token
any of them has sent makes the next ones slower, as a shared machine slowing down
over a sweep would. Run as a script (`python fake_openai.py PORT MS_PER_TOKEN`) it
serves alone, without drift.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Machine:
    """What the servers on it share: the drift (each token sent multiplies later
    tokens' time by 1 + `drift` more) and the log of requests (server name, in the
    order they started)."""

    def __init__(self, drift: float = 0.0) -> None:
        self.drift = drift
        self.tokens = 0
        self.requests: list[str] = []
        self._lock = threading.Lock()

    def start_request(self, name: str) -> None:
        with self._lock:
            self.requests.append(name)

    def token_time(self, seconds: float) -> float:
        with self._lock:
            slowdown = 1.0 + self.drift * self.tokens
            self.tokens += 1
        return seconds * slowdown


def _handler(name: str, ms_per_token: float, machine: Machine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, b"ok", "text/plain")
            elif self.path == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [{"id": "fake", "object": "model"}]}).encode())
            else:
                self._send(404, json.dumps({"error": {"message": "not found"}}).encode())

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            n = int(body.get("max_tokens", 8))
            machine.start_request(name)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()  # HTTP/1.0: the stream ends when the connection closes
            due = time.perf_counter()
            for i in range(n):
                # each token is due a token time after the previous one was due, so a late
                # wake-up (a busy machine) is made up by the next sleep instead of adding up
                due += machine.token_time(ms_per_token / 1e3)
                time.sleep(max(0.0, due - time.perf_counter()))
                self._event({"choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}]})
            self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                         "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}})
            self.wfile.write(b"data: [DONE]\n\n")

        def _event(self, obj: dict) -> None:
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            self.wfile.flush()

        def _send(self, status: int, payload: bytes, kind: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


class FakeServer:
    """`with FakeServer("a", 20.0, machine) as url:` serves on a free port in a thread."""

    def __init__(self, name: str, ms_per_token: float, machine: Machine | None = None, port: int = 0) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(name, ms_per_token, machine or Machine()))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> str:
        self.thread.start()
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


if __name__ == "__main__":
    port, ms = int(sys.argv[1]), float(sys.argv[2])
    FakeServer(f"port{port}", ms, port=port).httpd.serve_forever()

"""Fault-injection doubles, named Fake: used only where a real part can't produce the fault on demand.

`FakeOpenAIServer` speaks just enough of the OpenAI chat API to answer 5xx, hang, or answer slowly
on a scripted request; llama.cpp's server cannot be made to do those on cue.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Fault:
    status: int = 200  # HTTP status to answer with
    delay_s: float = 0.0  # sleep before answering (a slow or hanging engine)
    content: str = "```python\ndef add(a, b):\n    return a + b\n```"


@dataclass
class FakeOpenAIServer:
    """Answers request i with script[i] (the last entry repeats)."""

    script: list[Fault]
    requests: list[dict] = field(default_factory=list)
    port: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _next(self, body: dict) -> Fault:
        with self._lock:
            self.requests.append(body)
            return self.script[min(len(self.requests), len(self.script)) - 1]

    @contextmanager
    def running(self) -> Iterator[FakeOpenAIServer]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fault = fake._next(body)
                time.sleep(fault.delay_s)
                if fault.status != 200:
                    payload = {"error": {"message": f"injected {fault.status}", "type": "server_error"}}
                else:
                    payload = {
                        "id": "fake",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body.get("model", "fake"),
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": fault.content},
                            }
                        ],
                        "usage": {"prompt_tokens": 7, "completion_tokens": 11, "total_tokens": 18},
                    }
                data = json.dumps(payload).encode()
                try:
                    self.send_response(fault.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout): that is the point of a hanging fault

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()

"""Fault-injection doubles, named Fake: used only where a real part can't produce the fault on demand.

`FakeOpenAIServer` speaks just enough of the OpenAI chat API (plain and `stream=True`) to answer
5xx, hang before the first token, stall between tokens, or answer slowly on a scripted request;
llama.cpp's server cannot be made to do those on cue. `close_after_s` reproduces, on cue, what
llama.cpp's server does after every streamed reply: HTTP/1.1, chunked, `Keep-Alive` advertised,
and the connection closed right after the last chunk.
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
    stall_after: int | None = None  # streaming: stop sending after this many pieces (and hang)
    # streaming as llama.cpp's server does: HTTP/1.1 chunked with keep-alive advertised, then the
    # connection closed this long after the last chunk (a request sent on it meanwhile is lost)
    close_after_s: float | None = None


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
                if fault.status == 200 and body.get("stream"):
                    self._stream(body, fault)
                    return
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

            def _stream(self, body: dict, fault: Fault) -> None:
                """Server-sent events, one piece per line of the content, then usage and [DONE]."""
                pieces = fault.content.splitlines(keepends=True)
                chunked = fault.close_after_s is not None
                if chunked:
                    self.protocol_version = "HTTP/1.1"  # the connection still closes after this reply

                def event(data: dict | str) -> None:
                    text = data if isinstance(data, str) else json.dumps(data)
                    payload = f"data: {text}\n\n".encode()
                    if chunked:
                        payload = b"%x\r\n%s\r\n" % (len(payload), payload)
                    self.wfile.write(payload)
                    self.wfile.flush()

                def chunk(delta: dict, usage: dict | None = None) -> dict:
                    choices = [] if usage else [{"index": 0, "delta": delta, "finish_reason": None}]
                    out = {"id": "fake", "object": "chat.completion.chunk", "created": 0}
                    return {**out, "model": body.get("model", "fake"), "choices": choices, "usage": usage}

                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    if chunked:
                        self.send_header("Transfer-Encoding", "chunked")
                        self.send_header("Keep-Alive", "timeout=5, max=100")
                    self.end_headers()
                    for i, piece in enumerate(pieces):
                        if fault.stall_after is not None and i >= fault.stall_after:
                            time.sleep(3600)
                        event(chunk({"content": piece}))
                    event(
                        chunk({}, {"prompt_tokens": 7, "completion_tokens": len(pieces), "total_tokens": 7})
                    )
                    event("[DONE]")
                    if chunked:
                        self.wfile.write(b"0\r\n\r\n")
                        self.wfile.flush()
                        time.sleep(fault.close_after_s)
                except (BrokenPipeError, ConnectionResetError):
                    pass

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

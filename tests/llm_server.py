"""A real OpenAI-compatible HTTP server for tests: replies come from a script, requests are recorded.

    with ScriptedServer(["```cpp\\n...\\n```", (429, {"error": {...}}, {"Retry-After": "0"})]) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x")
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ScriptedServer:
    """POST /v1/chat/completions answers with the next scripted reply; the last one repeats.

    A reply is a string (the assistant's content) or a tuple (status, body_dict, headers).
    `stream: true` requests get server-sent events, one word a chunk, `token_delay_s` apart.
    `serial=True` answers one request at a time, as llama.cpp's server does, each taking `delay_s`
    before its first token; `max_in_flight` counts the requests the server held at once (waiting
    included), which is what floods a local server."""

    def __init__(self, replies: list, delay_s: float = 0.0, token_delay_s: float = 0.0, serial: bool = False):
        if not replies:
            raise ValueError("ScriptedServer needs at least one reply")
        self.replies = list(replies)
        self.requests: list[dict] = []
        self.delay_s, self.token_delay_s = delay_s, token_delay_s
        self.in_flight = self.max_in_flight = 0
        self.dropped = 0                     # answers the client hung up on
        self._serial = threading.Lock() if serial else None
        self._next = 0
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        """Stays valid after stop(), so tests can match it in error messages."""
        return f"http://127.0.0.1:{self.port}/v1"

    def _take(self, body: dict):
        with self._lock:
            self.requests.append(body)
            reply = self.replies[min(self._next, len(self.replies) - 1)]
            self._next += 1
            return reply

    @staticmethod
    def completion(content: str, model: str, prompt_tokens: int) -> dict:
        completion_tokens = max(1, len(content.split()))
        return {
            "id": "chatcmpl-" + uuid.uuid4().hex[:12], "object": "chat.completion",
            "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def _send(self, status: int, body: dict, headers: dict | None = None):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, str(v))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.rstrip("/") != "/v1/models":
                    self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                    return
                self._send(200, {"object": "list", "data": [{"id": "scripted-model", "object": "model",
                                                             "owned_by": "tests"}]})

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                    return
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    self._send(400, {"error": {"message": "body is not JSON", "type": "invalid_request"}})
                    return
                with server._lock:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    if server._serial is not None:
                        with server._serial:
                            self._answer(body)
                    else:
                        self._answer(body)
                except (BrokenPipeError, ConnectionResetError):
                    server.dropped += 1
                finally:
                    with server._lock:
                        server.in_flight -= 1

            def _answer(self, body: dict):
                reply = server._take(body)
                if server.delay_s:
                    time.sleep(server.delay_s)
                if isinstance(reply, tuple):
                    status, err, headers = (tuple(reply) + ({},))[:3]
                    self._send(status, err, headers)
                    return
                prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
                done = server.completion(reply, body.get("model", "scripted"), prompt_tokens)
                if not body.get("stream"):
                    self._send(200, done)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                base = {k: done[k] for k in ("id", "created", "model")}
                words = reply.split(" ")
                for i, w in enumerate(words):
                    piece = w + (" " if i + 1 < len(words) else "")
                    self._event({**base, "object": "chat.completion.chunk",
                                 "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
                    if server.token_delay_s:
                        time.sleep(server.token_delay_s)
                self._event({**base, "object": "chat.completion.chunk",
                             "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                if (body.get("stream_options") or {}).get("include_usage"):
                    self._event({**base, "object": "chat.completion.chunk", "choices": [], "usage": done["usage"]})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            def _event(self, obj: dict):
                self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                self.wfile.flush()

        return Handler

    def start(self) -> "ScriptedServer":
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=5)
            self._httpd = None

    def __enter__(self) -> "ScriptedServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

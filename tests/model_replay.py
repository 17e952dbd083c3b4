"""A real OpenAI-compatible HTTP server on 127.0.0.1 that replays recorded model replies (good,
malformed, unsafe, slow, failing) and records what it was sent: where a test needs a model that
writes a given reply, which no model on these machines can be relied on to write."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Replay(BaseHTTPRequestHandler):
    replies: list[tuple[int, str, float]] = []     # (HTTP status, message content, delay seconds)
    prompts: list[str] = []
    formats: list[dict] = []  # type: ignore[type-arg]
    answer: Callable[[str], str] | None = None      # else: the reply to the prompt (replies unused)

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Replay.prompts.append(body["messages"][-1]["content"])
        Replay.formats.append(body.get("response_format", {}))
        if Replay.answer is not None:
            status, content, delay = 200, Replay.answer(Replay.prompts[-1]), 0.0
        else:
            status, content, delay = Replay.replies.pop(0)
        time.sleep(delay)
        payload = json.dumps({"id": "r", "object": "chat.completion", "created": 0, "model": body["model"],
                              "choices": [{"index": 0, "finish_reason": "stop",
                                           "message": {"role": "assistant", "content": content}}],
                              "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        if status != 200:
            payload = b'{"error": {"message": "server error", "type": "server_error"}}'
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):   # the client gave up (timeout)
            pass

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def replay_server() -> Iterator[str]:
    """The server's base URL (…/v1); what it was sent is in Replay.prompts and Replay.formats."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Replay)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    Replay.prompts.clear()
    Replay.formats.clear()
    Replay.answer = None
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    finally:
        srv.shutdown()
        srv.server_close()

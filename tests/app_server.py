"""An ASGI app (the embedded HTTP server's `create_app`, or a stub) served by uvicorn in a
thread of the test process, for tests that need a real server on 127.0.0.1 without a child
process. Shared across test folders; imported by bare name."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def serving_app(app: Any, sock: socket.socket | None = None) -> Iterator[str]:
    """Serve `app` on `sock` (bound already, so nothing listened there until now: a test of a
    command that waits for its server) or on a fresh port; yields `http://127.0.0.1:PORT` once
    it listens, and stops the server (and closes the socket) on the way out."""
    import uvicorn

    if sock is None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert thread.is_alive(), "the test server stopped before it listened"
            assert time.monotonic() < deadline, "the test server did not start in 60 s"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@contextmanager
def tiny_app(model_name: str = "tiny", *, token: str | None = None) -> Iterator[Any]:
    """`ludic serve`'s app over the tiny local model (an embedded engine closed on the way
    out), serving it as `model_name`; `token` guards its control endpoints (weight pushes)."""
    from ludic.inference.embedded.engine import EmbeddedEngine
    from ludic.inference.http.server import create_app
    from ludic.models import tiny_model_dir

    engine = EmbeddedEngine.from_pretrained(tiny_model_dir())
    try:
        yield create_app(engine, model_name=model_name, token=token)
    finally:
        engine.close()


def until(condition: Callable[[], bool], what: str, timeout: float = 300) -> None:
    """Wait for `condition` (polled every 50 ms), failing the test naming `what` after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@contextmanager
def serving_json(answer: Callable[[Any], tuple[int, Any]]) -> Iterator[str]:
    """A stub HTTP server (standard library, in a thread, on a fresh port) whose every GET and
    POST is answered by `answer(handler)` -> (status, JSON body), the handler giving the
    request's `command`, `path` and `headers`; yields its base URL."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)  # the request's body, unread by the stubs
            status, body = answer(self)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)

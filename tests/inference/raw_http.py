"""Test helpers: serve an ASGI app as `ludic serve` runs it (uvicorn with `guard_reads`) on a
thread, and talk raw HTTP/1.1 to it over a socket, as hostile clients do."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from starlette.types import ASGIApp

from ludic.inference.http.read_deadlines import guard_reads


@contextmanager
def serving_guarded(app: ASGIApp, bound_s: float = 1.0) -> Iterator[tuple[str, int]]:
    """`app` under `guard_reads` (head and body bounds of `bound_s`), served by uvicorn on a
    thread as `ludic serve` runs it; yields its host and port."""
    timed, protocol = guard_reads(app, header_timeout_s=bound_s, body_timeout_s=bound_s)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(timed, http=protocol, log_level="error")  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the test server stopped before it listened"
        time.sleep(0.05)
    try:
        yield "127.0.0.1", sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def exchange(address: tuple[str, int], data: bytes, *, shut: bool = False) -> bytes:
    """Send `data` on a new connection (then shut its sending side with `shut`) and return all
    the server sends until it closes the connection (bounded by a 60 s socket timeout)."""
    with socket.create_connection(address, timeout=60) as sock:
        sock.sendall(data)
        if shut:
            sock.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
        return got


def request(path: str, body: bytes, *headers: str, method: str = "POST") -> bytes:
    """One HTTP/1.1 request with a JSON body and its Content-Length."""
    lines = [f"{method} {path} HTTP/1.1", "Host: x", "Content-Type: application/json"]
    lines += [f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def status_of(reply: bytes) -> int:
    """The status code of the first reply in `reply` (0 when there is none)."""
    first = reply.split(b"\r\n", 1)[0].split()
    return int(first[1]) if len(first) >= 2 and first[0].startswith(b"HTTP/") else 0

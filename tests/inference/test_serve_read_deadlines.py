"""Hostile clients that open connections and never finish a request (slowloris): a
connection that sends nothing, one that trickles its head a byte at a time (also after a
reply, on a kept-alive connection), one that declares a body and stops, one that trickles it. Each is closed once its bound passes (a 408
first where part of a request came), while four good clients keep getting replies, and a
slow but progressing weight upload, longer than the body bound, still lands. Without the
bounds uvicorn held them all for ever (until the file-descriptor limit refused good
clients). Real sockets against `ludic serve`'s app over the tiny model, served by uvicorn
with `guard_reads` as `ludic serve` runs it (small bounds); one test through `ludic serve`."""

from __future__ import annotations

import asyncio
import io
import select
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn
from safetensors.torch import save
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.local_server import LocalServer
from ludic.inference.http.read_deadlines import guard_reads
from ludic.inference.http.serve_config import ServeConfig, check_serve_config
from ludic.inference.http.server import create_app
from ludic.models import load_tiny_model, tiny_model_dir

TOKEN = "deadlines"
BOUND_S = 1.0
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@contextmanager
def _serving(app: ASGIApp, lifespan: str = "auto") -> Iterator[str]:
    """`app` under `guard_reads` (bounds of `BOUND_S`), served by uvicorn with its protocol
    in a thread, as `ludic serve` runs it; yields its URL."""
    timed, protocol = guard_reads(app, header_timeout_s=BOUND_S, body_timeout_s=BOUND_S)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(timed, http=protocol, log_level="error", lifespan=lifespan)  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the test server stopped before it listened"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, EmbeddedEngine]]:
    model, tokenizer = load_tiny_model()
    engine = EmbeddedEngine(model, tokenizer)
    with engine, _serving(create_app(engine, model_name="tiny", token=TOKEN)) as url:
        yield url, engine


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=60)


def _until_closed(sock: socket.socket, trickle: bytes = b"") -> bytes:
    """What the server sends until it closes the connection, sending one byte of `trickle`
    every 0.1 s meanwhile (a client that never stops). Bounded by the socket's timeout."""
    sock.setblocking(False)
    got = b""
    sent = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        readable, _, _ = select.select([sock], [], [], 0.1)
        if readable:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return got
            if not chunk:
                return got
            got += chunk
        elif sent < len(trickle):
            try:
                sock.send(trickle[sent : sent + 1])
            except OSError:  # closed under us: read what it said
                continue
            sent += 1
    raise AssertionError(f"the server did not close the connection in 60 s (it sent {got!r})")


def _good_clients(url: str, stop: threading.Event, failures: list[str], count: list[int]) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        while not stop.is_set():
            for reply in (
                client.get("/health"),
                client.post("/v1/chat/completions", json=CHAT),
            ):
                if reply.status_code != 200:
                    failures.append(f"{reply.request.url}: {reply.status_code} {reply.text}")
            count.append(1)


def test_stalled_connections_are_closed_while_good_clients_are_served(
    served: tuple[str, EmbeddedEngine],
) -> None:
    url, _ = served
    stop, failures, count = threading.Event(), [], []  # type: ignore[var-annotated]
    good = [
        threading.Thread(target=_good_clients, args=(url, stop, failures, count)) for _ in range(4)
    ]
    head = b"GET /health HTTP/1.1\r\nHost: x\r\n"
    post = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    stalled: list[tuple[str, bytes, bytes]] = []  # (what, sent at once, trickled)
    for _ in range(3):
        stalled += [
            ("silent", b"", b""),
            ("head trickle", head, b"X-Slow: " + b"a" * 500),
            ("trickle after a reply", head + b"\r\n", b"GET /health HTTP/1.1\r\n" + b"a" * 500),
            ("body stalled", post + b"Content-Length: 1000\r\n\r\n" + b'{"mess', b""),
            ("body trickle", post + b"Content-Length: 1000\r\n\r\n", b" " * 1000),
        ]
    results: dict[int, bytes] = {}

    def hold(index: int, sent: bytes, trickled: bytes) -> None:
        with _connect(url) as sock:
            sock.sendall(sent)
            results[index] = _until_closed(sock, trickled)

    holders = [
        threading.Thread(target=hold, args=(i, sent, trickled))
        for i, (_, sent, trickled) in enumerate(stalled)
    ]
    for thread in good + holders:
        thread.start()
    for thread in holders:
        thread.join()
    stop.set()
    for thread in good:
        thread.join()

    assert not failures, failures[:3]
    assert count, "no good request completed"
    for index, (what, _, _) in enumerate(stalled):
        said = results[index]
        if what == "silent":
            assert said == b"", said  # nothing came: closed without a reply
        elif what == "trickle after a reply":  # kept alive: timed from the next head's start
            assert said.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 408" in said, said
            assert b"--header-timeout" in said, said
        else:
            assert said.startswith(b"HTTP/1.1 408"), (what, said)
            assert b"--header-timeout" in said or b"--body-timeout" in said, (what, said)


def _raw_post(url: str, path: str, body: bytes, pace: Callable[[int], None]) -> bytes:
    """POST `body` to `path` over a raw socket in 8 pieces, `pace(i)` before each."""
    with _connect(url) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        piece = -(-len(body) // 8)
        for i in range(8):
            pace(i)
            sock.sendall(body[i * piece : (i + 1) * piece])
        reply = io.BytesIO()
        while chunk := sock.recv(65536):
            reply.write(chunk)
        return reply.getvalue()


def test_a_slow_but_progressing_weight_upload_lands(served: tuple[str, EmbeddedEngine]) -> None:
    url, engine = served
    state = {k: v.detach().clone().contiguous() for k, v in engine.model.state_dict().items()}
    payload = save(state)
    # eight pieces 0.3 s apart: the upload takes twice the body bound, arriving all along
    reply = _raw_post(
        url, "/ludic/update_weights?version=7", payload, lambda i: i and time.sleep(0.3)
    )
    assert reply.startswith(b"HTTP/1.1 200"), reply[:400]
    assert b'"policy_version":7' in reply, reply[-200:]


def test_a_reply_its_client_does_not_read_is_abandoned() -> None:
    """A client that asks for a long reply and never reads it: once the connection's buffers
    are full the reply waits for it for ever, holding the connection (and a stream's
    request). The bound drops it; a good client is served meanwhile."""
    ended = threading.Event()

    async def endless() -> AsyncIterator[bytes]:
        while True:  # waiting between chunks, as the engine's stream does
            await asyncio.sleep(0)
            yield b"x" * 65536

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] != "/endless":
            await PlainTextResponse("ok")(scope, receive, send)
            return
        try:
            await StreamingResponse(endless())(scope, receive, send)
        finally:
            ended.set()

    with _serving(app, lifespan="off") as url, socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        host, port = url.removeprefix("http://").split(":")
        sock.connect((host, int(port)))
        sock.sendall(b"GET /endless HTTP/1.1\r\nHost: x\r\n\r\n")  # and never reads
        assert httpx.get(url + "/", timeout=60).text == "ok"
        assert ended.wait(timeout=60), "the unread reply was still being sent after 60 s"


@pytest.mark.parametrize("field", ["header_timeout", "body_timeout"])
@pytest.mark.parametrize("seconds", [0.0, -1.0, float("nan"), float("inf")])
def test_a_timeout_that_is_not_a_positive_number_is_refused(field: str, seconds: float) -> None:
    config = ServeConfig(model="m", **{field: seconds})  # type: ignore[arg-type]
    flag = "--" + field.replace("_", "-")
    with pytest.raises(ValueError, match=f"{flag} must be a positive number of seconds"):
        check_serve_config(config)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ludic_serve_closes_a_trickled_head(tmp_path: Path) -> None:
    args = ("--header-timeout", "1")
    with LocalServer(tiny_model_dir(), args=args, log_path=tmp_path / "serve.log") as server:
        with _connect(server.url) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\n")
            said = _until_closed(sock, b"Host: " + b"x" * 500)
        assert said.startswith(b"HTTP/1.1 408") and b"--header-timeout" in said, said
        assert httpx.get(server.url + "/health", timeout=60).status_code == 200

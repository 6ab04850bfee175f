"""A client that closes its sending side (`shutdown(SHUT_WR)`, `nc -N`) before its reply, or in
the middle of its request head or body, gets a 400 saying so as its connection closes; uvicorn
closed it with no reply at all. Its request is still cancelled as a gone client's: a FIN reads
the same whether the client only shut its sending side or closed its socket, and cancelling
the requests of clients that leave (the common case) is what the server keeps. The server
goes on serving others. Real sockets against uvicorn with `guard_reads`, as `ludic serve`
runs it, over a small app whose request waits for its client to leave."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from raw_http import exchange, request, serving_guarded, status_of
from starlette.types import Message, Receive, Scope, Send

LEFT = threading.Event()  # the held request saw its client leave


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    """`/held` reads its body, then answers only once its client has gone (never, then);
    any other path answers at once."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    message: Message = {"more_body": True}
    while scope["path"] == "/held" and message.get("more_body", False):
        message = await receive()
        if message["type"] == "http.disconnect":
            break
    while scope["path"] == "/held" and message["type"] != "http.disconnect":
        message = await receive()
    if scope["path"] == "/held":
        LEFT.set()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def address() -> Iterator[tuple[str, int]]:
    with serving_guarded(_app, bound_s=30.0) as address:
        yield address


def _error_message(reply: bytes) -> str:
    import json

    return str(json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]["message"])


def test_a_client_shut_for_sending_before_its_reply_is_told_why(
    address: tuple[str, int],
) -> None:
    LEFT.clear()
    reply = exchange(address, request("/held", b"{}"), shut=True)
    assert status_of(reply) == 400, reply
    assert _error_message(reply) == (
        "the client closed its sending side (shutdown(SHUT_WR)) before its reply: the server "
        "takes that as the client gone (a closed socket sends the same) and cancels its "
        "request; keep the connection open until the reply arrives"
    )
    assert LEFT.wait(60)  # cancelled as a gone client's, as before
    assert status_of(exchange(address, request("/fast", b"{}", "Connection: close"))) == 200


@pytest.mark.parametrize(
    ("sent", "said"),
    [
        (request("/held", b'{"a": 1}' * 10)[:-20], "the request body ended early"),
        (
            b'POST /held HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"a":',
            "the request body ended early",
        ),
        (b"GET /fast HTTP/1.1\r\nHost: x\r\n", "the request head ended early"),
    ],
    ids=["body-short-of-its-length", "chunked-without-its-last-chunk", "head-unfinished"],
)
def test_a_request_cut_short_by_a_half_close_is_a_400_naming_what(
    address: tuple[str, int], sent: bytes, said: str
) -> None:
    reply = exchange(address, sent, shut=True)  # was b"" (or a 408 after --body-timeout)
    assert status_of(reply) == 400, reply
    assert _error_message(reply).startswith(said)
    assert status_of(exchange(address, request("/fast", b"{}", "Connection: close"))) == 200


def test_a_half_close_after_a_reply_closes_quietly(address: tuple[str, int]) -> None:
    """Nothing waits for a reply on a kept-alive connection: its FIN closes it, no 400."""
    with socket.create_connection(address, timeout=60) as sock:
        sock.sendall(b"GET /fast HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        while not reply.endswith(b"ok"):
            chunk = sock.recv(65536)
            assert chunk, reply
            reply += chunk
        sock.shutdown(socket.SHUT_WR)
        rest = b""
        while chunk := sock.recv(65536):
            rest += chunk
    assert status_of(reply) == 200 and rest == b"", (reply, rest)

"""Hostile HTTP clients of `ludic serve` over raw sockets: malformed framing (a chunk size that
is not hex, a chunk longer than it says, Content-Length beside chunked, a Content-Length that
is not a number, a method that is not one) gets a 400 naming what the parser found (uvicorn
said "Invalid HTTP request received." of all of them), two requests pipelined on one
connection get their own replies in order, a body cut short by a closed socket costs nothing,
and two hundred connections trickling heads at once are all closed (408) while good clients
are served. The server goes on serving after each. `ludic serve`'s app over the tiny model,
run by uvicorn with `guard_reads` as `ludic serve` runs it (bounds of 1 s)."""

from __future__ import annotations

import json
import select
import socket
from collections.abc import Iterator

import httpx
import pytest
from raw_http import exchange, request, serving_guarded, status_of

from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.server import create_app
from ludic.models import load_tiny_model

CHAT = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()


@pytest.fixture(scope="module")
def address() -> Iterator[tuple[str, int]]:
    model, tokenizer = load_tiny_model()
    engine = EmbeddedEngine(model, tokenizer)
    with engine, serving_guarded(create_app(engine, model_name="tiny")) as address:
        yield address


def _still_serving(address: tuple[str, int]) -> None:
    reply = exchange(address, request("/v1/chat/completions", CHAT, "Connection: close"))
    assert status_of(reply) == 200, reply


def _message(reply: bytes) -> str:
    return str(json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]["message"])


CHUNKED = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


@pytest.mark.parametrize(
    ("sent", "reason"),
    [
        (CHUNKED + b"Transfer-Encoding: chunked\r\n\r\nZZ\r\nabc\r\n0\r\n\r\n", "chunk size"),
        (
            CHUNKED + b'Transfer-Encoding: chunked\r\n\r\n5\r\n{"messages"\r\n0\r\n\r\n',
            "Expected LF after chunk data",
        ),
        (
            CHUNKED + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "Transfer-Encoding can't be present with Content-Length",
        ),
        (CHUNKED + b"Content-Length: abc\r\n\r\n", "Content-Length"),
        (b"G\x00T / HTTP/1.1\r\nHost: x\r\n\r\n", "method"),
    ],
    ids=[
        "chunk-size-not-hex",
        "chunk-longer-than-said",
        "length-and-chunked",
        "length-nan",
        "method",
    ],
)
def test_malformed_framing_is_a_400_naming_what_the_parser_found(
    address: tuple[str, int], sent: bytes, reason: str
) -> None:
    reply = exchange(address, sent)
    assert status_of(reply) == 400, reply
    message = _message(reply)
    assert message.startswith("the request is not valid HTTP/1.1 (") and reason in message
    _still_serving(address)


def test_pipelined_requests_get_their_own_replies_in_order(address: tuple[str, int]) -> None:
    def completion(max_tokens: int) -> bytes:
        body = json.dumps({"prompt": [5, 6, 7], "max_tokens": max_tokens, "ignore_eos": True})
        return body.encode()

    sent = request("/v1/completions", completion(3)) + request(
        "/v1/completions", completion(1), "Connection: close"
    )
    reply = exchange(address, sent)  # both requests in one write
    parts = reply.split(b"HTTP/1.1 ")[1:]
    assert len(parts) == 2 and all(p.startswith(b"200") for p in parts), reply
    usage = [json.loads(p.split(b"\r\n\r\n", 1)[1])["usage"]["completion_tokens"] for p in parts]
    assert usage == [3, 1]


def test_a_body_cut_short_by_a_closed_socket_costs_nothing(address: tuple[str, int]) -> None:
    with socket.create_connection(address, timeout=60) as sock:
        sock.sendall(request("/v1/chat/completions", CHAT)[:-10])  # then closes
    _still_serving(address)


def test_two_hundred_trickled_heads_are_closed_while_good_clients_are_served(
    address: tuple[str, int],
) -> None:
    slow = [socket.create_connection(address, timeout=60) for _ in range(200)]
    try:
        for sock in slow:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        url = f"http://{address[0]}:{address[1]}"
        with httpx.Client(base_url=url, timeout=60) as good:
            for _ in range(5):
                assert good.get("/health").status_code == 200
                assert good.post("/v1/chat/completions", json=json.loads(CHAT)).status_code == 200
        said = {sock: b"" for sock in slow}
        open_ = set(slow)
        while open_:  # each is closed by the head bound (the socket timeout bounds a hang)
            readable, _, _ = select.select(list(open_), [], [], 60)
            assert readable, f"{len(open_)} trickling connections still open after 60 s"
            for sock in readable:
                chunk = sock.recv(65536)
                said[sock] += chunk
                if not chunk:
                    open_.discard(sock)
        assert all(status_of(reply) == 408 for reply in said.values())
    finally:
        for sock in slow:
            sock.close()
    _still_serving(address)

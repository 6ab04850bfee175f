"""Bad input to `ludic serve` and its client: prompts far over the context, clients that go away
or time out, and text with a lone surrogate. A real server subprocess on 127.0.0.1, and the same
checks in process."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from test_server import Server, start_server

from ludic.inference import ChatRequest, SamplingConfig
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.openai_client import InferenceTimeoutError, OpenAICompatibleClient
from ludic.models import load_tiny_model, tiny_model_dir

HUGE_TEXT = "hello world " * 600_000  # 7.2 MB: under the 8 MiB body cap, ~3.6M tokens
LONG_GENERATION = {"max_tokens": 2000, "ignore_eos": True}  # seconds of decoding on the tiny model
SURROGATE = "a\ud800b"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tiny_model_dir(), tmp_path_factory.mktemp("server") / "server.log")
    yield srv
    srv.stop()


@pytest.fixture
def engine() -> Iterator[EmbeddedEngine]:
    model, tokenizer = load_tiny_model()
    with EmbeddedEngine(model, tokenizer) as eng:
        yield eng


def chat(content: str, **sampling: Any) -> ChatRequest:
    return ChatRequest(
        messages=[{"role": "user", "content": content}],
        sampling=SamplingConfig(max_tokens=4, **sampling),
    )


def health(server: Server) -> dict[str, Any]:
    reply: dict[str, Any] = httpx.get(server.url + "/health", timeout=30).json()
    return reply


def wait_until_idle(server: Server, timeout_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while (h := health(server))["active"] or h["pending"]:
        assert time.monotonic() < deadline, f"the server never went idle: {h}"
        time.sleep(0.05)
    return h


# --- a prompt far over the context -------------------------------------------------------------


async def test_a_prompt_far_over_the_context_is_refused_from_its_head(
    engine: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 7.2 MB prompt is refused with the over-context error without the tokenizer ever
    seeing more than a context's worth of it; prompts near the context keep the exact count."""
    encode, seen = engine.tokenizer.encode, []

    def recording_encode(text: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(len(text))
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(engine.tokenizer, "encode", recording_encode)
    with pytest.raises(ValueError, match=r"at least \d+ tokens .* context is 2048 tokens"):
        await engine.complete(chat(HUGE_TEXT))
    assert max(seen) < len(HUGE_TEXT) / 100, seen
    with pytest.raises(ValueError, match=r"the prompt has \d+ tokens but .* 2048 tokens"):
        await engine.complete(chat("hello world " * 400))  # ~2,400 tokens, tokenized whole
    near = chat("hello world " * 50, extras={"ignore_eos": True})  # a sampled eos: "stop"
    assert (await engine.complete(near)).finish_reason == "length"


@pytest.mark.slow
async def test_huge_prompts_do_not_hold_up_normal_requests(server: Server) -> None:
    """Five 7.2 MB prompts (four chats, one per admission thread, and a text completion) are
    refused while a normal request sent just after them is answered in a fraction of the time
    one of them takes to tokenize whole (it waited that long when they were tokenized whole:
    they held every admission thread)."""
    _, tokenizer = load_tiny_model()
    eighth = HUGE_TEXT[: len(HUGE_TEXT) // 8]
    started = time.perf_counter()
    tokenizer.encode(eighth, add_special_tokens=False)
    whole_s = 8 * (time.perf_counter() - started)
    normal = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    huge = json.dumps({"messages": [{"role": "user", "content": HUGE_TEXT}], "max_tokens": 4})
    huge_text = json.dumps({"prompt": HUGE_TEXT, "max_tokens": 4})
    async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:

        async def timed_normal() -> float:
            await asyncio.sleep(0.5)  # the huge bodies are on their way
            begun = time.perf_counter()
            reply = await client.post("/v1/chat/completions", json=normal)
            assert reply.status_code == 200, reply.text
            return time.perf_counter() - begun

        sent = [
            client.post(path, content=body, headers={"Content-Type": "application/json"})
            for path, body in [("/v1/chat/completions", huge)] * 4
            + [("/v1/completions", huge_text)]
        ]
        *refused, waited_s = await asyncio.gather(*sent, timed_normal())
    for reply in refused:
        assert reply.status_code == 400, reply.text[:300]
        assert "context is 2048 tokens" in reply.json()["error"]["message"]
    assert waited_s < whole_s / 3, (waited_s, whole_s)


# --- a client that goes away or times out ------------------------------------------------------


def test_a_client_leaving_cancels_its_unstreamed_request(server: Server) -> None:
    """The connection is closed while the reply is being decoded; the server cancels it (a
    request run to its end is not counted as cancelled)."""
    before = wait_until_idle(server)["cancelled"]
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], **LONG_GENERATION})
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as conn:
        conn.sendall((head + body).encode())
        deadline = time.monotonic() + 60
        while health(server)["active"] == 0:
            assert time.monotonic() < deadline, "the request never started decoding"
            time.sleep(0.02)
    after = wait_until_idle(server)
    assert after["cancelled"] == before + 1, "the abandoned request ran to its end"


async def test_a_timed_out_generation_is_not_resent_and_is_cancelled(server: Server) -> None:
    """max_retries=3 used to send the request four times (four generations running); now one
    attempt, an error saying which knob to raise, and the server cancels the one it had."""
    before = wait_until_idle(server)["cancelled"]
    transport = CountingTransport()
    client = OpenAICompatibleClient(
        server.url, "tiny", timeout=0.5, max_retries=3, backoff_s=0.01, transport=transport
    )
    async with client:
        request = ChatRequest(
            messages=[{"role": "user", "content": "hi"}],
            sampling=SamplingConfig(max_tokens=2000, seed=5, extras={"ignore_eos": True}),
        )
        with pytest.raises(InferenceTimeoutError, match=r"not resent.*timeout=\.\.\."):
            await client.complete(request)
    assert transport.sent == 1
    assert wait_until_idle(server)["cancelled"] == before + 1


class CountingTransport(httpx.AsyncHTTPTransport):
    """The real transport, counting the requests it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        return await super().handle_async_request(request)


# --- a lone surrogate --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "where"),
    [
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "a\\ud800b"}], "max_tokens": 4}',
            "messages[0].content",
        ),
        ("/v1/completions", b'{"prompt": "a\\ud800b", "max_tokens": 4}', "prompt"),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_where_it_is(
    server: Server, path: str, body: bytes, where: str
) -> None:
    reply = httpx.post(
        server.url + path, content=body, headers={"Content-Type": "application/json"}
    )
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert message.startswith(f"{where} holds a lone surrogate '\\ud800' at character 1 ")
    assert "replace it" in message


async def test_a_lone_surrogate_in_process_is_the_same_value_error(
    server: Server, engine: EmbeddedEngine
) -> None:
    body = b'{"messages": [{"role": "user", "content": "a\\ud800b"}], "max_tokens": 4}'
    reply = httpx.post(
        server.url + "/v1/chat/completions",
        content=body,
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(ValueError) as raised:
        await engine.complete(chat(SURROGATE))
    assert type(raised.value) is ValueError
    assert str(raised.value) == reply.json()["error"]["message"]


async def test_the_client_refuses_a_lone_surrogate_without_sending_it(server: Server) -> None:
    transport = CountingTransport()
    async with OpenAICompatibleClient(server.url, "tiny", transport=transport) as client:
        with pytest.raises(ValueError, match=r"messages\[0\]\.content holds a lone surrogate"):
            await client.complete(chat(SURROGATE))
    assert transport.sent == 0

"""Wrongly typed fields and OpenAI content parts sent to a real `ludic serve` subprocess while
good requests are in flight: each bad request is a 400 naming its field and the fix, and
every good request alongside it still succeeds.

Before: pydantic's lax mode served `max_tokens: true` as 1, `temperature: true` as 1.0,
`"n": "2"` as 2 and `"stream": "yes"` as a stream (a client's wrong field sampled as something
it never asked for); a stop string holding a lone surrogate (no text can match it) was accepted
and never stopped anything; and content parts, even plain text ones, failed in the chat
template with "can only concatenate str (not list) to str", naming neither the part nor the fix."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from test_server import Server, start_server

from ludic.models import tiny_model_dir

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tiny_model_dir(), tmp_path_factory.mktemp("server") / "server.log")
    yield srv
    srv.stop()


def chat(**fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "seed": 1, **fields}


WRONG_TYPES = [
    ({"max_tokens": True}, "body.max_tokens: Input should be a valid integer"),
    ({"max_tokens": 4.0}, "body.max_tokens: Input should be a valid integer"),
    ({"temperature": True}, "body.temperature: Input should be a valid number"),
    ({"temperature": "0.5"}, "body.temperature: Input should be a valid number"),
    ({"n": "2"}, "body.n: Input should be a valid integer"),
    ({"stream": "yes"}, "body.stream: Input should be a valid boolean"),
    ({"return_token_ids": 1}, "body.return_token_ids: Input should be a valid boolean"),
    ({"ignore_eos": "true"}, "body.ignore_eos: Input should be a valid boolean"),
    ({"seed": "7"}, "body.seed: Input should be a valid integer"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "include_usage"),
    ({"stop": ["x", "a\ud800"]}, "stop[1] holds a lone surrogate '\\ud800' at character 1"),
    ({"stop": "\udfff", "stream": True}, "stop[0] holds a lone surrogate"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "messages[0].content[0] is type 'image_url': this server serves text only; send content",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, 5]}]},
        "messages[0].content[1] is a int, not a content part",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]},
        "messages[0].content[0] is a text part whose 'text' is not a string",
    ),
]


async def test_wrong_types_are_400s_naming_the_field_and_good_requests_go_on(
    server: Server,
) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:

        async def post(body: dict[str, Any]) -> httpx.Response:  # \ud800 escapes as JSON has them
            content = json.dumps(body).encode()
            headers = {"Content-Type": "application/json"}
            return await client.post("/v1/chat/completions", content=content, headers=headers)

        good = [post(chat(seed=i, max_tokens=8)) for i in range(6)]
        bad = [post(chat(**fields)) for fields, _ in WRONG_TYPES]
        replies = await asyncio.gather(*good, *bad)
        assert all(r.status_code == 200 for r in replies[: len(good)])
        for reply, (fields, message) in zip(replies[len(good) :], WRONG_TYPES, strict=True):
            assert reply.status_code == 400, (fields, reply.text)
            assert message in reply.json()["error"]["message"], (fields, reply.text)
        assert (await client.get("/health")).json()["status"] == "ok"


async def test_text_content_parts_are_served_as_the_joined_string(server: Server) -> None:
    parts = [{"type": "text", "text": "Your"}, {"type": "text", "text": "move."}]
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
        as_parts, as_text = await asyncio.gather(
            client.post(
                "/v1/chat/completions",
                json=chat(messages=[{"role": "user", "content": parts}], return_token_ids=True),
            ),
            client.post(
                "/v1/chat/completions",
                json=chat(
                    messages=[{"role": "user", "content": "Your\nmove."}], return_token_ids=True
                ),
            ),
        )
    assert as_parts.status_code == 200, as_parts.text
    assert as_parts.json()["prompt_token_ids"] == as_text.json()["prompt_token_ids"]
    assert as_parts.json()["choices"][0]["token_ids"] == as_text.json()["choices"][0]["token_ids"]

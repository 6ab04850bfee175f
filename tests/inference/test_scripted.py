"""ScriptedClient: deterministic replies with append-only byte-level token traces."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from ludic.inference.client import ChatRequest
from ludic.inference.scripted import (
    IM_END,
    IM_START,
    ScriptedClient,
    decode_ids,
    encode_text,
    render_chatml_ids,
)
from ludic.types import Message


async def test_replies_cycle_and_requests_are_recorded() -> None:
    client = ScriptedClient(["a", "b"], policy_version=4)
    texts = []
    for _ in range(3):
        r = await client.complete(ChatRequest(messages=[{"role": "user", "content": "q"}]))
        texts.append(r.text)
        assert r.policy_version == 4 and r.finish_reason == "stop"
    assert texts == ["a", "b", "a"] and client.calls == 3 and len(client.requests) == 3


async def test_trace_is_append_only_across_a_dialog() -> None:
    client = ScriptedClient(["héllo 🤖", ("cut off", "length"), "done"])
    messages: list[Message] = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    previous: tuple[int, ...] | None = None
    for _ in range(3):
        r = await client.complete(ChatRequest(messages=list(messages)))
        assert r.prompt_token_ids == tuple(render_chatml_ids(messages))
        if previous is not None:  # the new prompt extends the previous prompt + completion
            assert r.prompt_token_ids[: len(previous)] == previous
        previous = r.prompt_token_ids + r.completion_token_ids
        assert r.completion_logprobs is not None
        assert len(r.completion_logprobs) == len(r.completion_token_ids)
        assert all(lp < 0 for lp in r.completion_logprobs)
        assert decode_ids(r.completion_token_ids) == r.text
        messages += [{"role": "assistant", "content": r.text}, {"role": "user", "content": "go"}]


async def test_length_reply_has_no_end_marker_and_stop_reply_has_one() -> None:
    client = ScriptedClient([("abc", "length"), "abc"])
    cut = await client.complete(ChatRequest(messages=[]))
    full = await client.complete(ChatRequest(messages=[]))
    assert cut.finish_reason == "length" and cut.completion_token_ids == tuple(encode_text("abc"))
    assert full.completion_token_ids == (*encode_text("abc"), IM_END)


async def test_token_in_mode_and_reply_functions_and_no_logprobs() -> None:
    def reply(messages: Sequence[Message]) -> str:
        return f"saw {len(messages)}"

    client = ScriptedClient(reply, return_logprobs=False)
    r = await client.complete(ChatRequest(messages=[{"role": "user"}], prompt_token_ids=[9, 8]))
    assert r.text == "saw 1" and r.prompt_token_ids == (9, 8) and r.completion_logprobs is None
    trace = r.trace()
    assert trace is not None and trace.completion_logprobs is None


async def test_logprobs_are_deterministic() -> None:
    request = ChatRequest(messages=[{"role": "user", "content": "x"}])
    a = await ScriptedClient(["same"]).complete(request)
    b = await ScriptedClient(["same"]).complete(request)
    assert a.completion_logprobs == b.completion_logprobs


def test_chatml_rendering() -> None:
    ids = render_chatml_ids([{"role": "user", "content": "hi"}])
    assert ids == [
        IM_START,
        *encode_text("user\nhi"),
        IM_END,
        *encode_text("\n"),
        IM_START,
        *encode_text("assistant\n"),
    ]


async def test_empty_reply_list_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one reply"):
        await ScriptedClient([]).complete(ChatRequest(messages=[]))

"""A prompt past the context is refused with advice that fits the engine it met: the model's
own context (ludic train, eval and actor; `ludic serve` without --max-model-len) can only be
met by a shorter conversation, while a cap set below it (EngineConfig.max_model_len, `ludic
serve --max-model-len`) can be raised up to it. Before, every refusal said to raise
EngineConfig.max_model_len or `ludic serve --max-model-len`: a flag ludic train has not, and
one `ludic serve` refuses past the model's context. Each wording is still read as a context
overflow (ludic.rollouts.overflow: ludic train's overflow watch, ludic eval's closing line)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from ludic.inference.client import ChatRequest
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.embedded.engine_config import EngineConfig
from ludic.inference.http.json_body import JSONBound
from ludic.inference.http.server import create_app
from ludic.inference.sampling import SamplingConfig
from ludic.models import load_tiny_model
from ludic.rollouts.overflow import OVERFLOW_ERROR

OWN = 2048  # the tiny model's max_position_embeddings
CAP = 40


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[EmbeddedEngine, EmbeddedEngine]]:
    model, tokenizer = load_tiny_model()
    own = EmbeddedEngine(model, tokenizer)
    capped = EmbeddedEngine(model, tokenizer, config=EngineConfig(max_model_len=CAP))
    with own, capped:
        assert own.max_model_len == OWN and capped.max_model_len == CAP
        yield own, capped


async def _refusal(engine: EmbeddedEngine, request: ChatRequest) -> str:
    with pytest.raises(ValueError) as caught:
        await engine.complete(request)
    return str(caught.value)


def _requests(length: int) -> list[ChatRequest]:
    sampling = SamplingConfig(max_tokens=2)
    long_text = "word " * (4 * length)  # refused from its head: the shortcut's own refusal
    return [
        ChatRequest(messages=[], sampling=sampling, prompt_token_ids=[5] * length),
        ChatRequest(messages=[{"role": "user", "content": long_text}], sampling=sampling),
    ]


async def test_past_the_models_own_context_only_a_shorter_prompt_is_advised(
    engines: tuple[EmbeddedEngine, EmbeddedEngine],
) -> None:
    own, _ = engines
    for request in _requests(OWN + 10):
        message = await _refusal(own, request)
        assert f"the model's context is {OWN} tokens; shorten the conversation" in message
        assert "max-model-len" not in message and "max_model_len" not in message
        assert OVERFLOW_ERROR.search(message)


async def test_past_a_cap_below_the_models_context_raising_it_is_advised(
    engines: tuple[EmbeddedEngine, EmbeddedEngine],
) -> None:
    _, capped = engines
    for request in _requests(CAP + 10):
        message = await _refusal(capped, request)
        assert f"context is {CAP} tokens here, capped below its own {OWN}" in message
        assert f"raise the cap up to {OWN}" in message
        assert "--max-model-len" in message and "EngineConfig.max_model_len" in message
        assert OVERFLOW_ERROR.search(message)


def test_ludic_serves_text_prompt_refusal_gives_the_same_advice(
    engines: tuple[EmbeddedEngine, EmbeddedEngine],
) -> None:
    own, capped = engines
    body = {"prompt": "word " * (4 * OWN + 40), "max_tokens": 2}
    with TestClient(create_app(own, model_name="tiny")) as client:
        reply = client.post("/v1/completions", json=body)
    assert reply.status_code == 400, reply.text
    assert "max-model-len" not in reply.json()["error"]["message"]
    with TestClient(create_app(capped, model_name="tiny")) as client:
        reply = client.post("/v1/completions", json=body)
    assert reply.status_code == 400, reply.text
    assert "--max-model-len; in Python" in reply.json()["error"]["message"]


def test_the_json_bound_offers_a_longer_context_only_below_the_models_own() -> None:
    assert "--max-model-len" not in JSONBound.for_context(OWN, OWN).fix
    assert "--max-model-len" not in JSONBound.for_context(OWN).fix
    assert f"--max-model-len up to {OWN}" in JSONBound.for_context(CAP, OWN).fix

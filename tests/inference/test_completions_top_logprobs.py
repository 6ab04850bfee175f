"""`/v1/completions` with `logprobs` above 1 asks for that many top candidates per token, which the
embedded server does not compute: a 400 naming the field and what it returns (the sampled
token's logprob), as chat's `top_logprobs` is refused. It used to answer with the sampled token's
logprob only and `top_logprobs: null`, as if the request had been honoured. 0, 1 and true are
served as before."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.server import create_app
from ludic.models import load_tiny_model

PROMPT = {"prompt": [5, 6, 7], "max_tokens": 3, "seed": 1}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    model, tokenizer = load_tiny_model()
    with (
        EmbeddedEngine(model, tokenizer) as engine,
        TestClient(create_app(engine, model_name="tiny")) as test_client,
    ):
        yield test_client


@pytest.mark.parametrize("logprobs", [2, 5, 20, -1])
@pytest.mark.parametrize("stream", [False, True])
def test_top_candidates_are_refused_naming_the_field(
    client: TestClient, logprobs: int, stream: bool
) -> None:
    reply = client.post("/v1/completions", json={**PROMPT, "logprobs": logprobs, "stream": stream})
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert message.startswith(f"logprobs={logprobs} is not supported"), message
    assert "only the sampled token's logprob is returned" in message


@pytest.mark.parametrize("logprobs", [0, 1, True])
def test_the_sampled_tokens_logprob_is_served(client: TestClient, logprobs: Any) -> None:
    reply = client.post("/v1/completions", json={**PROMPT, "logprobs": logprobs})
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert len(choice["logprobs"]["token_logprobs"]) == 3
    assert choice["logprobs"]["top_logprobs"] is None

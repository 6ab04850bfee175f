"""A completion budget (`--max-tokens`) at or past the context a server gives its model
(`max_model_len` on its `/v1/models` card, as `ludic serve` and vLLM list it) is refused before
any episode by train, eval and actor, naming the flag, the server and the fix: every request
would be a 400, every episode failed, and `ludic actor --batches N` exited 0. The servers here
are stubs answering `/v1/models` only."""

from __future__ import annotations

from typing import Any

import pytest
from test_served_model_routing import models_stub

from ludic.cli import main as ludic_main
from ludic.recipes.inference import make_inference, served_model_for


def _card(max_model_len: Any) -> dict[str, Any]:
    return {"id": "tiny", "object": "model", "owned_by": "ludic", "max_model_len": max_model_len}


def test_a_budget_past_the_context_is_refused_naming_the_fix() -> None:
    with models_stub([_card(2048)]) as (url, _):
        with pytest.raises(ValueError) as refused:
            served_model_for([url], None, None, max_tokens=4000)
        assert served_model_for([url], None, None, max_tokens=2047) == "tiny"
        assert served_model_for([url], None, None) == "tiny"  # no budget given: not checked
    assert str(refused.value).startswith(
        f"--max-tokens 4000 leaves no room for a prompt: the server at {url}/v1/models serves "
        "tiny with max_model_len 2048 (prompt and completion together)"
    )
    assert "pass --max-tokens below 2048" in str(refused.value)
    # the card cannot say whether 2048 is the model's own context or a server cap below it
    assert str(refused.value).endswith(
        "a model with a longer one, or, where the server's --max-model-len (`ludic serve`, "
        "vLLM) was set below the model's own, a higher one"
    )


@pytest.mark.parametrize("listed", [None, "2048", True, -1])
def test_a_card_without_a_usable_context_passes(listed: Any) -> None:
    with models_stub([_card(listed)]) as (url, _):
        assert served_model_for([url], "tiny", None, max_tokens=10**6) == "tiny"


def test_ludic_eval_refuses_it_before_any_episode() -> None:
    refusal = "--max-tokens 128 leaves no room for a prompt"
    with models_stub([_card(64)]) as (url, _), pytest.raises(ValueError, match=refusal):
        ludic_main(
            [
                "eval",
                "--env",
                "tictactoe",
                "--no-progress",
                "--server-url",
                url,
                "--max-tokens",
                "128",
            ]
        )


def test_make_inference_refuses_it_as_ludic_train_passes_it() -> None:
    with models_stub([_card(64)]) as (url, _), pytest.raises(ValueError) as refused:
        make_inference(None, None, server_url=url, server_token="t", max_tokens=128)
    assert str(refused.value).startswith("max_tokens=128 leaves no room for a prompt")


def test_the_embedded_engine_refuses_a_budget_past_the_models_context() -> None:
    # without a server the engine serves max_position_embeddings: past it, every episode of
    # the first step failed and an unchanged checkpoint was saved before any error
    from ludic.models import build_tiny_model

    model, tokenizer = build_tiny_model()
    context = model.config.max_position_embeddings
    with pytest.raises(ValueError) as refused:
        make_inference(model, tokenizer, max_tokens=context)
    assert str(refused.value).startswith(  # named as the caller spells it: here the argument
        f"max_tokens {context} leaves no room for a prompt: the model's context is {context}"
    )
    assert f"pass max_tokens below {context}" in str(refused.value)
    assert make_inference(model, tokenizer, max_tokens=context - 1).client is not None

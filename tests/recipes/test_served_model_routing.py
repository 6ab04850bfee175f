"""Which `/v1/models` answers refuse a model name: only a server known to route by it (`ludic
serve`, vLLM: `owned_by` ludic / vllm) refuses a name it does not list, another (SGLang ignores
the request's model) gets one warning line; a 401 / 403 is refused naming the API key, asked
with what the client sends (never `ludic train`'s control token); an empty list says so. Each
server here is a stub answering `/v1/models` only, in a thread."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from app_server import serving_json
from ludic.envs.single_agent import SingleAgentEnv
from ludic.eval.command import EvalConfig, run_eval_command
from ludic.recipes.inference import (
    ModelsUnauthorized,
    check_served_model,
    make_inference,
    served_model_for,
    served_model_name,
    server_push_token,
)
from ludic.types import Info, StepOutcome


@contextmanager
def models_stub(
    cards: list[dict[str, Any]], *, api_key: str | None = None
) -> Iterator[tuple[str, list[str | None]]]:
    """A server whose `/v1/models` lists `cards` (401 without `Bearer api_key` when given); its
    URL and the Authorization headers it was sent."""
    seen: list[str | None] = []

    def answer(request: Any) -> tuple[int, Any]:
        given = request.headers.get("Authorization")
        seen.append(given)
        if api_key is not None and given != f"Bearer {api_key}":
            return 401, {"error": "Unauthorized"}
        if request.path == "/v1/models":
            return 200, {"object": "list", "data": cards}
        return 404, {"error": "not found"}

    with serving_json(answer) as url:
        yield url, seen


def card(name: str, owned_by: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "owned_by": owned_by}


def test_sglang_answers_any_name_so_served_model_default_only_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with models_stub([card("qwen", "sglang")]) as (url, _), caplog.at_level(logging.WARNING):
        assert served_model_for([url], "default", None) == "default"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert f"{url}/v1/models serves qwen, not default" in warnings[0]
    assert "owned_by sglang" in warnings[0]


def test_a_pool_of_sglang_servers_with_different_names_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        models_stub([card("a", "sglang")]) as (first, _),
        models_stub([card("b", "sglang")]) as (second, _),
        caplog.at_level(logging.WARNING),
    ):
        assert served_model_for([first, second], None, None) == "a"
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


@pytest.mark.parametrize("owner", ["ludic", "vllm"])
def test_a_server_routing_by_name_still_refuses_a_name_it_does_not_list(owner: str) -> None:
    refusal = "serves tiny, not default; pass --served-model tiny"
    with models_stub([card("tiny", owner)]) as (url, _), pytest.raises(ValueError, match=refusal):
        check_served_model(url, "default")


def test_a_401_is_refused_naming_the_api_key_flag() -> None:
    with models_stub([card("tiny", "vllm")], api_key="K") as (url, _):
        with pytest.raises(ModelsUnauthorized, match=r"401 Unauthorized.*pass the server's key"):
            check_served_model(url, "tiny")  # was skipped silently: every episode then failed
        with pytest.raises(ModelsUnauthorized, match=r"and got none: pass .* with --api-key"):
            served_model_for([url], None, None)  # was 'is the server up?'
        with pytest.raises(ModelsUnauthorized, match="refused the one --api-key gives"):
            served_model_for([url], None, "wrong")
        assert served_model_for([url], None, "K") == "tiny"


def test_train_asks_v1_models_with_what_its_client_sends_not_the_control_token() -> None:
    """vLLM --api-key T and `ludic train --server-token T`: its client sends no key on
    inference requests, so /v1/models asked with the control token passed and every episode
    then failed; asked as the client asks, the run is refused before any push."""
    with (
        models_stub([card("tiny", "vllm")], api_key="T") as (url, seen),
        pytest.raises(ModelsUnauthorized, match="sends none on its inference requests"),
    ):
        make_inference(None, None, server_url=url, server_token="T")
    assert seen == [None]


def test_a_server_listing_no_model_says_so() -> None:
    with models_stub([]) as (url, _), pytest.raises(ValueError) as refused:
        served_model_name(url)
    assert str(refused.value) == (
        f"{url}/v1/models lists no model, so there is no model name to send: pass "
        "--served-model with the name the server serves (or wait until it has loaded one)"
    )


def test_the_push_token_is_read_from_auth_token_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import ludic.inference.http.auth as auth

    monkeypatch.setattr(auth, "TOKEN_ENV", "LUDIC_TEST_OTHER_TOKEN")
    monkeypatch.delenv("LUDIC_SERVER_TOKEN", raising=False)
    monkeypatch.setenv("LUDIC_TEST_OTHER_TOKEN", "secret")
    assert server_push_token(None) == "secret"
    monkeypatch.setattr(auth, "well_formed_token", lambda token: False)
    with pytest.raises(ValueError, match=r"\$LUDIC_TEST_OTHER_TOKEN is not printable ASCII"):
        server_push_token(None)


class OneQuestionEnv(SingleAgentEnv):
    """One step: any reply ends the episode with reward 1."""

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return f"question {seed}", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="done", reward=1.0, terminated=True, info={})


def test_eval_resolves_the_model_before_overwrite_deletes(tmp_path: Path) -> None:
    """No --served-model and a server listing two: refused before --overwrite deleted the
    earlier run's records (the name was resolved only when the client was built)."""
    earlier = tmp_path / "metrics.json"
    earlier.write_text("{}\n")
    with (
        models_stub([card("a", "ludic"), card("b", "ludic")]) as (url, _),
        pytest.raises(ValueError, match="serves a, b; choose one with --served-model"),
    ):
        run_eval_command(
            EvalConfig(
                env=f"{__name__}:OneQuestionEnv",
                server_url=url,
                num_problems=1,
                max_steps=1,
                max_tokens=4,
                out_dir=tmp_path,
                overwrite=True,
                progress=False,
            ),
            console=Console(record=True),
        )
    assert earlier.read_text() == "{}\n"

"""`make_inference` and `make_client` called from Python name their own arguments when the
served-model check refuses (`served_model=`, `api_key=`, `server_url=`): it named the `ludic`
commands' flags (`--served-model`, `--api-key`), which a Python caller never passed. The
commands and `InferenceArgs` (whose settings are flags) keep naming the flags; their CLI tests
pin the whole lines. Each server here is a stub answering `/v1/models` only, in a thread."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from app_server import serving_json
from ludic.recipes.inference import (
    InferenceArgs,
    ModelsUnauthorized,
    make_client,
    make_inference,
    served_model_for,
)

FLAG = re.compile(r"--[a-z][a-z-]*")


def _python_flags(message: str) -> list[str]:
    """The flags `message` names as this caller's settings: not those of another program, a
    command in backticks (`ludic serve --model DIR`) or vLLM's (`vLLM --api-key`)."""
    message = re.sub(r"`[^`]*`", "", message).replace("vLLM --api-key", "")
    return FLAG.findall(message)


@contextmanager
def serving(*names: str, api_key: str | None = None) -> Iterator[str]:
    """A vLLM-like server whose `/v1/models` lists `names` (401 without `Bearer api_key`)."""

    def answer(request: Any) -> tuple[int, Any]:
        if api_key is not None and request.headers.get("Authorization") != f"Bearer {api_key}":
            return 401, {"error": "Unauthorized"}
        cards = [{"id": name, "object": "model", "owned_by": "vllm"} for name in names]
        return 200, {"object": "list", "data": cards}

    with serving_json(answer) as url:
        yield url


def _refusal(build: Any, **kwargs: Any) -> str:
    with pytest.raises(ValueError) as refused:
        build(**kwargs)
    message = str(refused.value)
    assert _python_flags(message) == [], message
    return message


def _inference(**kwargs: Any) -> Any:
    return make_inference(None, None, server_token="T", **kwargs)


def test_a_name_the_server_does_not_list() -> None:
    with serving("tiny") as url:
        message = _refusal(_inference, server_url=url, served_model="nope")
    assert message == (
        f"served_model='nope': the server at {url}/v1/models serves tiny, not nope; pass "
        "served_model='tiny' or leave it out"
    )


def test_servers_that_serve_other_models() -> None:
    with serving("a") as first, serving("b") as second:
        message = _refusal(_inference, server_url=[first, second])
    assert message == (
        f"the model a (no served_model=: the one {first}/v1/models lists): the server at "
        f"{second}/v1/models serves b, not a; the servers get the same model name: start them "
        "all serving one model, or pass served_model= with a name each of them lists"
    )


def test_a_server_serving_two_or_none() -> None:
    with serving("a", "b") as url:
        message = _refusal(make_client, server_url=url)
    assert message.endswith("serves a, b; choose one with served_model=")
    with serving() as url:
        message = _refusal(make_client, server_url=url)
    assert "lists no model, so there is no model name to send: pass served_model= with" in message


def test_a_server_that_wants_an_api_key() -> None:
    with serving("tiny", api_key="K") as url:
        message = _refusal(_inference, server_url=url)
        assert "and got none: pass the server's key with api_key= (without it the client " in (
            message
        )
        message = _refusal(make_client, server_url=url, api_key="wrong")
        assert message.endswith("and refused the one api_key= gives: pass the server's key")


def test_a_server_that_does_not_answer() -> None:
    with serving("tiny") as url:
        pass  # stopped: nothing listens there now
    message = _refusal(make_client, server_url=url)
    assert message.endswith("Or name the model (served_model=)"), message


def test_the_commands_and_inference_args_still_name_their_flags() -> None:
    with serving("tiny") as url:
        with pytest.raises(ValueError, match=r"pass --served-model tiny or leave the flag out$"):
            served_model_for([url], "nope", None)  # as `ludic actor` and `ludic eval` call it
        args = InferenceArgs(server_url=(url,), server_token="T", served_model="nope")
        with pytest.raises(ValueError, match=r"^--served-model nope: .* leave the flag out$"):
            args.make(None, None)
    with serving("a", "b") as url, pytest.raises(ValueError, match=r"one with --served-model$"):
        InferenceArgs(server_url=(url,)).make_client()
    with serving("tiny", api_key="K") as url, pytest.raises(ModelsUnauthorized) as refused:
        InferenceArgs(server_url=(url,)).make_client()
    assert "pass the server's key with --api-key (without it this command sends" in str(
        refused.value
    )

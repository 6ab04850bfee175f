"""`ludic train --api-key K` against a server started with `--api-key K` (vLLM then wants
`Authorization: Bearer K` on every /v1/* request): `make_inference` sends K on the
`/v1/models` check and on every inference request, and the control token (--server-token)
never goes there. Without the key the run is refused naming --api-key; with no --server-url
the flag is refused before the model loads. The server is a stub in a thread answering
`/v1/models` and `/v1/chat/completions` as vLLM's API-key check does (401 on /v1/* without
the key)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from app_server import serving_json
from ludic.cli import main
from ludic.inference import ChatRequest, SamplingConfig
from ludic.recipes.inference import (
    InferenceArgs,
    ModelsUnauthorized,
    as_flag,
    close_client,
    make_inference,
)

KEY = "inference-key"
CONTROL = "control-token"
CHAT_REPLY = {
    "choices": [
        {
            "message": {"role": "assistant", "content": "hi"},
            "logprobs": {"content": [{"token": "hi", "logprob": -0.5}]},
            "finish_reason": "stop",
            "token_ids": [7],
        }
    ],
    "prompt_token_ids": [1, 2],
}


@contextmanager
def keyed_server() -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    """A server wanting `Bearer KEY` on /v1/* (401 otherwise, as vLLM --api-key); its URL and
    each request's (path, Authorization header)."""
    seen: list[tuple[str, str | None]] = []

    def answer(request: Any) -> tuple[int, Any]:
        given = request.headers.get("Authorization")
        seen.append((request.path, given))
        if request.path.startswith("/v1") and given != f"Bearer {KEY}":
            return 401, {"error": "Unauthorized"}
        if request.command == "GET" and request.path == "/v1/models":
            card = {"id": "tiny", "object": "model", "owned_by": "vllm"}
            return 200, {"object": "list", "data": [card]}
        if request.command == "POST" and request.path == "/v1/chat/completions":
            return 200, CHAT_REPLY
        return 404, {"error": "not found"}

    with serving_json(answer) as url:
        yield url, seen


async def _one_episode_request(args: InferenceArgs) -> str:
    """Build the run's inference as `ludic train` does (`InferenceArgs.make` ->
    `make_inference`) and send one chat request through its client."""
    inference = args.make(None, None)
    try:
        request = ChatRequest(
            messages=[{"role": "user", "content": "q"}],
            sampling=SamplingConfig(max_tokens=4),
        )
        return (await inference.client.complete(request)).text
    finally:
        await close_client(inference.client)


def test_the_api_key_reaches_the_models_check_and_every_inference_request() -> None:
    with keyed_server() as (url, seen):
        args = InferenceArgs(server_url=(url,), server_token=CONTROL, api_key=KEY)
        assert asyncio.run(_one_episode_request(args)) == "hi"
    assert seen == [
        ("/v1/models", f"Bearer {KEY}"),
        ("/v1/chat/completions", f"Bearer {KEY}"),
    ]


def test_without_the_api_key_train_is_refused_naming_the_flag() -> None:
    with (
        keyed_server() as (url, seen),
        pytest.raises(ModelsUnauthorized, match="got none: pass the server's key with --api-key"),
    ):
        # as `ludic train` calls it (from Python the refusal names `api_key=`)
        make_inference(None, None, server_url=url, server_token=CONTROL, spell=as_flag)
    assert seen == [("/v1/models", None)]  # the control token is not sent as the key


def test_api_key_without_server_url_is_refused_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import ludic.recipes.train as train

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model loaded before --api-key was refused")

    monkeypatch.setattr(train, "load_policy", no_load)
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "train",
                *("--env", "tictactoe", "--api-key", KEY, "--steps", "1"),
                *("--out-dir", str(tmp_path / "run"), "--no-progress"),
            ],
            report_refusals=True,
        )
    assert exit_info.value.code == 1
    refusal = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert refusal == [
        "ludic train: error: --api-key is the key of --server-url's inference endpoints (vLLM "
        "--api-key), and this run has no --server-url (the embedded engine, or --local-server, "
        "wants none): drop --api-key, or pass --server-url"
    ]

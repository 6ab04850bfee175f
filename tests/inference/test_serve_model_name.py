"""The name `ludic serve` answers to: a training checkpoint (`.../step_N` or `.../step_N/model`)
serves as "ludic", whichever step, so clients need not guess; another directory by its name;
`--served-model-name` wins. A request naming another model is a 404 naming the served one, as
OpenAI servers answer (and the client raises it as `InferenceRequestError`)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import httpx
import pytest

from ludic.inference import ChatRequest, SamplingConfig
from ludic.inference.http.local_server import LocalServer
from ludic.inference.http.openai_client import InferenceRequestError, OpenAICompatibleClient
from ludic.inference.http.serve_config import CHECKPOINT_SERVED_NAME, ServeConfig, served_name
from ludic.models import tiny_model_dir


def _checkpoint(tmp_path: Path, step: int) -> Path:
    """A checkpoint step folder as `ludic train` writes it (its `model/` is loadable, its
    MANIFEST.json marks the save finished: `load_model` refuses a step without one)."""
    from ludic.training.checkpoint_manifest import write_manifest

    folder = tmp_path / "run" / "checkpoints" / f"step_{step:08d}"
    shutil.copytree(tiny_model_dir(), folder / "model")
    write_manifest(folder, step)
    return folder


def test_a_checkpoint_serves_as_ludic_whichever_step_and_path(tmp_path: Path) -> None:
    for step in (3, 40):
        folder = _checkpoint(tmp_path, step)
        for given in (folder, folder / "model", f"{folder}/model/", f"{folder}/"):
            assert served_name(ServeConfig(model=str(given))) == CHECKPOINT_SERVED_NAME == "ludic"
    plain = tmp_path / "my-policy"
    shutil.copytree(tiny_model_dir(), plain)
    assert served_name(ServeConfig(model=str(plain))) == "my-policy"
    assert served_name(ServeConfig(model=f"{plain}/")) == "my-policy"
    named = ServeConfig(model=str(folder), served_model_name="policy-v2")
    assert served_name(named) == "policy-v2"


@pytest.mark.slow
def test_serving_a_checkpoint_answers_to_ludic_and_a_wrong_name_is_a_404(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path, 7)
    # the step folder `ludic train` prints, as `ludic serve` takes it
    with LocalServer(folder) as server:
        models = httpx.get(server.url + "/v1/models", timeout=30).json()
        assert [card["id"] for card in models["data"]] == ["ludic"]

        async def ask(model: str) -> list[int]:
            client = OpenAICompatibleClient(server.url, model=model, max_retries=0)
            request = ChatRequest(
                messages=[{"role": "user", "content": "hi"}],
                sampling=SamplingConfig(max_tokens=3, extras={"ignore_eos": True}),
            )
            try:
                return list((await client.complete(request)).completion_token_ids)
            finally:
                await client.aclose()

        assert len(asyncio.run(ask("ludic"))) == 3
        with pytest.raises(InferenceRequestError) as caught:
            asyncio.run(ask("step_00000007"))
        assert caught.value.status_code == 404
        said = caught.value.message
        assert "'step_00000007' does not exist" in said and "serves 'ludic'" in said, said
        assert "--served-model-name step_00000007" in said
        raw = httpx.post(
            server.url + "/v1/completions",
            json={"model": "model", "prompt": [1, 2], "max_tokens": 1},
            timeout=30,
        )
        assert raw.status_code == 404 and raw.json()["error"]["type"] == "NotFoundError"

"""LoRA + checkpoint + resume + `ludic serve` of the checkpoint, each a new process: a LoRA run
on a base model given by a relative path saves adapter checkpoints; `ludic serve --model` that
checkpoint, started from another directory, serves the merged policy; the run resumed in a new
process with `--server-url` that server pushes the restored weights before its first rollout
(the resumed step's episodes carry the checkpoint's policy version) and then each step's, and the
server ends serving exactly the final checkpoint's merged weights."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest
import torch
from combo_processes import TOKEN, program, records, run, serve, served_version, stop

from ludic.models import load_model, tiny_model_dir

pytest.importorskip("peft")

PROMPT_IDS = [5, 17, 42, 99, 3, 250, 7]


def _lora_run(cwd: Path, *args: str) -> str:
    return run(program("combo_lora_run.py", *args), cwd)


def _served(url: str) -> tuple[list[int], list[float]]:
    """A sampled completion of PROMPT_IDS (temperature 1, seeded) and its logprobs."""
    body = {
        "model": "ludic",
        "prompt": PROMPT_IDS,
        "max_tokens": 6,
        "temperature": 1.0,
        "seed": 0,
        "logprobs": 1,
        "return_token_ids": True,
    }
    choice = httpx.post(url + "/v1/completions", json=body, timeout=120).json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def _logprobs_of(checkpoint: Path, completion: list[int]) -> torch.Tensor:
    """The checkpoint's merged model's logprobs of `completion` after PROMPT_IDS."""
    model, _ = load_model(str(checkpoint))
    ids = torch.tensor([PROMPT_IDS + completion])
    with torch.no_grad():
        logits = model.eval()(input_ids=ids).logits[0, len(PROMPT_IDS) - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1).gather(1, ids[0, len(PROMPT_IDS) :, None])[
        :, 0
    ]


def _policy_versions(rollouts: Path) -> dict[int, set[int]]:
    """Per batch index, the policy versions its episodes' model calls were served at."""
    versions: dict[int, set[int]] = {}
    for record in records(rollouts):
        batch = versions.setdefault(record["meta"]["batch_index"], set())
        batch.update(step["policy_version"] for step in record["steps"] if step["kind"] == "agent")
    return versions


@pytest.mark.slow
def test_lora_checkpoint_served_then_resumed_against_that_server(tmp_path: Path) -> None:
    shutil.copytree(tiny_model_dir(seed=0, cache_dir=tmp_path / "models"), tmp_path / "base")
    assert "resumed at step 0" in _lora_run(tmp_path, "base", "run", "2")
    step2 = tmp_path / "run" / "checkpoints" / "step_00000002"
    assert (step2 / "model" / "adapter_config.json").is_file()
    assert not (step2 / "model" / "model.safetensors").exists()  # adapters only

    elsewhere = tmp_path / "elsewhere"  # the relative base must not matter from here
    elsewhere.mkdir()
    server, url = serve(step2, elsewhere, tmp_path / "serve.log")
    try:
        tokens2, logprobs2 = _served(url)
        served2 = torch.tensor(logprobs2)
        torch.testing.assert_close(served2, _logprobs_of(step2, tokens2), atol=1e-4, rtol=0)

        resumed = _lora_run(tmp_path, "base", "run", "4", url, TOKEN)
        assert "resumed at step 2" in resumed
        assert served_version(url) == 4
        step4 = tmp_path / "run" / "checkpoints" / "step_00000004"
        tokens4, logprobs4 = _served(url)
        served4 = torch.tensor(logprobs4)
        torch.testing.assert_close(served4, _logprobs_of(step4, tokens4), atol=1e-4, rtol=0)
        assert not torch.allclose(_logprobs_of(step4, tokens2), served2, atol=1e-4, rtol=0)
    finally:
        stop(server)
    # Batches 0-1 on the embedded engine; after the resume the first batch (index 2) was drawn
    # from the restored weights pushed as version 2, the next from version 3.
    assert _policy_versions(tmp_path / "run" / "rollouts.jsonl") == {
        0: {0},
        1: {1},
        2: {2},
        3: {3},
    }

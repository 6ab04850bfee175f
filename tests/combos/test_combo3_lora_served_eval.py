"""A LoRA run's adapter checkpoint -> `ludic serve --model` it -> `ludic eval --server-url` that
server, each a new process (README "Inference": a training checkpoint is served under the name
"ludic", at its policy version): the evaluation plays the merged policy, every model call at
the checkpoint's version, and each sampled token's logprob is the merged model's own (not the
base's, which the adapters moved away from)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from combo_processes import agent_steps, ludic, program, records, run, serve, stop

from ludic.models import load_model, tiny_model_dir

pytest.importorskip("peft")


def _logprobs(model_dir: Path, step: dict) -> torch.Tensor:
    """The logprobs `model_dir` gives a model call's sampled tokens after its prompt."""
    prompt, completion = step["trace"]["prompt_token_ids"], step["trace"]["completion_token_ids"]
    model, _ = load_model(str(model_dir))
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model.eval()(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return logprobs.gather(1, ids[0, len(prompt) :, None])[:, 0]


@pytest.mark.slow
def test_a_served_lora_checkpoint_is_evaluated_over_http_at_its_version(tmp_path: Path) -> None:
    shutil.copytree(tiny_model_dir(seed=0, cache_dir=tmp_path / "models"), tmp_path / "base")
    assert "resumed at step 0" in run(program("combo_lora_run.py", "base", "run", "2"), tmp_path)
    checkpoint = tmp_path / "run" / "checkpoints" / "step_00000002"
    assert (checkpoint / "model" / "adapter_config.json").is_file()

    elsewhere = tmp_path / "elsewhere"  # the run named its base relative to tmp_path
    elsewhere.mkdir()
    server, url = serve(checkpoint, elsewhere, tmp_path / "serve.log")
    try:
        run(
            ludic(
                *("eval", "--server-url", url, "--env", "combo_say_o:SayOEnv"),
                *("--num-problems", "2", "--samples-per-problem", "2", "--max-steps", "1"),
                *("--max-tokens", "8", "--out-dir", "eval", "--no-progress"),
            ),
            tmp_path,
        )
    finally:
        stop(server)

    assert len(records(tmp_path / "eval" / "rollouts.jsonl")) == 4
    steps = agent_steps(tmp_path / "eval" / "rollouts.jsonl")
    assert len(steps) == 4 and {s["policy_version"] for s in steps} == {2}
    for step in steps:
        served = torch.tensor(step["trace"]["completion_logprobs"])
        merged = _logprobs(checkpoint, step)
        torch.testing.assert_close(served, merged, atol=1e-4, rtol=0)
    moved = [_logprobs(tmp_path / "base", s) for s in steps]
    assert any(
        not torch.allclose(m, torch.tensor(s["trace"]["completion_logprobs"]), atol=1e-4)
        for m, s in zip(moved, steps, strict=True)
    )

"""LoRA + a KL term to a frozen reference + checkpoint + resume + `ludic eval` of the adapter
checkpoint, each a new process: a LoRA GRPO run with `kl_beta` (the reference a copy of the base
taken before `add_lora`) stopped after 2 steps and resumed to 4 equals the same run left
uninterrupted: the same losses and KL per step, the same sampled tokens, bit-identical adapter
weights. The resumed process measures the KL against the base again, not against the
checkpoint's merged weights (its first step's KL is as far from 0 as the uninterrupted run's).
`ludic eval --model` of the adapter checkpoint, from another directory (the base was named
relative to the run's), plays the merged policy at the checkpoint's version."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from combo_processes import (
    SPEC,
    agent_steps,
    completions,
    finish,
    ludic,
    program,
    records,
    run,
    start,
)
from safetensors.torch import load_file

from ludic.models import load_model, tiny_model_dir

pytest.importorskip("peft")
KL = "loss/kl_ref/kl_ref"


def _lora_run(out: str, total: int) -> list[str]:
    return program("combo2_lora_kl_run.py", "base", out, str(total))


def _adapter(out_dir: Path, step: int) -> dict[str, torch.Tensor]:
    checkpoint = out_dir / "checkpoints" / f"step_{step:08d}" / "model"
    return load_file(checkpoint / "adapter_model.safetensors")


def _first_token_logprobs(model_dir: Path, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    model, _ = load_model(str(model_dir))
    with torch.no_grad():
        logits = model.eval()(input_ids=torch.tensor([prompt])).logits[0, -1]
    return torch.log_softmax(logits.float(), dim=-1)[tokens]


@pytest.mark.slow
def test_lora_kl_run_resumed_equals_uninterrupted_and_evaluates(tmp_path: Path) -> None:
    shutil.copytree(
        tiny_model_dir(seed=0, spec=SPEC, cache_dir=tmp_path / "models"), tmp_path / "base"
    )
    whole = start(_lora_run("whole", 4), tmp_path)  # independent: runs meanwhile
    try:
        assert "resumed at step 0" in run(_lora_run("split", 2), tmp_path)
        assert "resumed at step 2" in run(_lora_run("split", 4), tmp_path)
    finally:
        finish(whole)

    split, uninterrupted = (
        records(tmp_path / "split" / "metrics.jsonl"),
        records(tmp_path / "whole" / "metrics.jsonl"),
    )
    assert [m["step"] for m in split] == [1, 2, 3, 4]
    for key in ("loss", KL, "batch/mean_reward"):
        assert [m[key] for m in split] == [m[key] for m in uninterrupted], key
    assert split[0][KL] == 0.0  # LoRA starts as the identity: the policy is the reference
    assert split[2][KL] > 0.0  # the resumed step still compares against the base
    assert completions(tmp_path / "split" / "rollouts.jsonl") == completions(
        tmp_path / "whole" / "rollouts.jsonl"
    )
    final, expected = _adapter(tmp_path / "split", 4), _adapter(tmp_path / "whole", 4)
    assert final.keys() == expected.keys()
    assert all(torch.equal(final[k], expected[k]) for k in final)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    checkpoint = tmp_path / "split" / "checkpoints" / "step_00000004"
    run(
        ludic(
            *("eval", "--env", "combo_say_o:SayOEnv", "--model", str(checkpoint)),
            *("--num-problems", "2", "--max-steps", "1", "--max-tokens", "8"),
            *("--concurrency", "1", "--out-dir", "eval", "--no-progress"),
        ),
        elsewhere,
    )
    played = agent_steps(elsewhere / "eval" / "rollouts.jsonl")
    assert len(played) == 2 and {s["policy_version"] for s in played} == {4}
    prompt = played[0]["trace"]["prompt_token_ids"]
    firsts = [
        s["trace"]["completion_token_ids"][0]
        for s in played
        if s["trace"]["prompt_token_ids"] == prompt
    ]
    served = torch.tensor(
        [
            s["trace"]["completion_logprobs"][0]
            for s in played
            if s["trace"]["prompt_token_ids"] == prompt
        ]
    )
    merged = _first_token_logprobs(checkpoint, prompt, firsts)
    torch.testing.assert_close(served, merged, atol=1e-4, rtol=0)
    assert not torch.allclose(
        served, _first_token_logprobs(tmp_path / "base", prompt, firsts), atol=1e-4, rtol=0
    )

"""`ludic train --resume` in a new process continues the run exactly: an online GRPO run on the
embedded engine, stopped after 2 steps and resumed in another process, samples the same tokens
and ends with bit-identical weights as the same run left uninterrupted for 4 steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from ludic.models import TinyModelSpec, tiny_model_dir

HERE = Path(__file__).parent
SPEC = TinyModelSpec(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tokenizer_vocab_size=300,
)


def start_ludic_train(out_dir: Path, model: Path, *extra: str) -> subprocess.Popen[str]:
    args = [
        *("--env", "resume_envs:SayOTwiceEnv", "--model", str(model)),
        *("--problems-per-step", "2", "--group-size", "3", "--max-steps", "2"),
        *("--max-tokens", "8", "--lr", "3e-2", "--seed", "7", "--checkpoint-every", "2"),
        *("--out-dir", str(out_dir), "--no-progress"),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    return subprocess.Popen(
        [sys.executable, "-m", "ludic.cli", "train", *args, *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(process: subprocess.Popen[str]) -> str:
    """The run's stdout, once it exited with code 0."""
    try:
        out, err = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, out + err
    return out


def sampled(out_dir: Path) -> dict[int, list[list[int]]]:
    """Each episode's sampled token ids per model call, keyed by its sampling seed."""
    episodes: dict[int, list[list[int]]] = {}
    for line in (out_dir / "rollouts.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert "error" not in record["meta"], record["meta"]
        episodes[record["meta"]["sampling_seed"]] = list(_completions(record))
    return episodes


def _completions(node: Any) -> Any:
    if isinstance(node, dict):
        if "completion_token_ids" in node:
            yield node["completion_token_ids"]
        for value in node.values():
            yield from _completions(value)
    elif isinstance(node, list):
        for value in node:
            yield from _completions(value)


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(checkpoint / "model" / "model.safetensors")


def losses(out_dir: Path) -> list[tuple[int, float, float]]:
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"], r["policy_version"]) for r in records]


# One episode in flight at a time; or several, at temperature 0.7, on the batch-invariant
# engine (what makes concurrent sampling independent of timing).
SAMPLING_FLAGS = [
    ("--concurrency", "1"),
    ("--concurrency", "4", "--batch-invariant", "--temperature", "0.7"),
]


@pytest.mark.slow
@pytest.mark.parametrize("flags", SAMPLING_FLAGS, ids=["sequential", "concurrent-t0.7"])
def test_resume_in_a_new_process_equals_the_uninterrupted_run(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    model = tiny_model_dir(seed=0, spec=SPEC, cache_dir=tmp_path / "models")
    whole, split = tmp_path / "whole", tmp_path / "split"
    # The uninterrupted run and the first half of the split one are independent: they run at
    # once (each leaves a core idle much of the time), which changes no bit of either.
    running = start_ludic_train(whole, model, "--steps", "4", *flags)
    try:
        finished(start_ludic_train(split, model, "--steps", "2", *flags))  # stops after 2 steps
        resumed = finished(start_ludic_train(split, model, "--steps", "4", "--resume", *flags))
        finished(running)
    finally:
        if running.poll() is None:
            running.kill()
            running.communicate()
    assert "resumed at step 2 (policy version 2)" in resumed

    # The same episodes sampled the same tokens, before and after the restart.
    assert sampled(split) == sampled(whole)
    assert len(sampled(whole)) == 4 * 2 * 3  # steps x problems x group size
    # Every step trained, on the same losses, and the resumed process went on at step 3.
    assert losses(split) == losses(whole)
    assert [version for _, _, version in losses(whole)] == [1.0, 2.0, 3.0, 4.0]
    # Bit-identical weights after 4 steps; and they did move after the restart.
    final_whole = weights(whole / "checkpoints" / "step_00000004")
    final_split = weights(split / "checkpoints" / "step_00000004")
    assert final_whole.keys() == final_split.keys()
    assert all(torch.equal(final_whole[k], final_split[k]) for k in final_whole)
    at_2 = weights(whole / "checkpoints" / "step_00000002")
    assert any(not torch.equal(at_2[k], final_whole[k]) for k in at_2)

    # A finished run has nothing left to resume.
    from ludic.recipes.configs import TrainConfig
    from ludic.recipes.train import train_command

    temperature = (
        float(flags[flags.index("--temperature") + 1]) if "--temperature" in flags else 1.0
    )
    done = TrainConfig(  # the run's own --lr and run flags: changed ones are refused first
        env="resume_envs:SayOTwiceEnv",
        model=str(model),
        steps=4,
        lr=3e-2,
        problems_per_step=2,
        group_size=3,
        max_tokens=8,
        temperature=temperature,
        seed=7,  # the run's: another --seed is refused too
        out_dir=split,
        resume="latest",
    )
    with pytest.raises(ValueError, match=r"at step 4 and --steps is 4.*raise --steps"):
        train_command(done)


def test_resume_without_a_checkpoint_says_how_to_start(tmp_path: Path) -> None:
    from ludic.recipes.configs import RESUME_LATEST, TrainConfig
    from ludic.recipes.train import train_command

    model = tiny_model_dir(seed=0, spec=SPEC, cache_dir=tmp_path / "models")
    cfg = TrainConfig(env="resume_envs:SayOTwiceEnv", model=str(model), out_dir=tmp_path / "run")
    with pytest.raises(FileNotFoundError, match=r"no complete checkpoint.*without --resume"):
        train_command(_replace(cfg, resume=RESUME_LATEST))
    with pytest.raises(FileNotFoundError, match="no such checkpoint"):
        train_command(_replace(cfg, resume=str(tmp_path / "elsewhere")))


def _replace(cfg: Any, **changes: Any) -> Any:
    from dataclasses import replace

    return replace(cfg, **changes)

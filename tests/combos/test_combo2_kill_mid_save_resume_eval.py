"""A crash mid checkpoint save -> `ludic train --resume` -> `ludic eval` of the checkpoint, each
a new process: a run killed with SIGKILL while it writes its step-4 checkpoint (every file but
the manifest written, in the scratch directory) leaves step 2 as its newest complete
checkpoint; `--resume` takes step 2 over the lock and the scratch the dead run left, drops the
logged steps 3-4 it retrains, and ends equal to the same run left uninterrupted (the same steps
once each, the same losses and sampled tokens, bit-identical weights); `ludic eval` of both
final checkpoints then plays the same episodes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from combo_processes import SPEC, completions, finish, ludic, program, records, run, start
from safetensors.torch import load_file

from ludic.models import tiny_model_dir

TRAIN_FLAGS = (
    *("--env", "combo_say_o:SayOEnv", "--problems-per-step", "2", "--group-size", "3"),
    *("--max-steps", "1", "--max-tokens", "8", "--lr", "3e-2", "--steps", "4"),
    *("--checkpoint-every", "2", "--concurrency", "1", "--threads", "1", "--no-progress"),
)


def _weights(out_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(out_dir / "checkpoints" / f"step_{step:08d}" / "model" / "model.safetensors")


@pytest.mark.slow
def test_killed_mid_save_resumes_from_the_last_good_checkpoint_and_evaluates(
    tmp_path: Path,
) -> None:
    model = str(tiny_model_dir(seed=0, spec=SPEC, cache_dir=tmp_path / "models"))
    # The uninterrupted run is independent of the killed one: they run at once.
    uninterrupted = start(
        ludic("train", *TRAIN_FLAGS, "--model", model, "--out-dir", "whole"), tmp_path
    )
    killed = run(
        program(
            "combo2_die_mid_save.py",
            "4",
            "train",
            *TRAIN_FLAGS,
            "--model",
            model,
            "--out-dir",
            "split",
        ),
        tmp_path,
        code=-9,
    )
    assert "killed while saving step 4" in killed
    checkpoints = tmp_path / "split" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("step_")) == [
        "step_00000002"
    ]
    (scratch,) = [p for p in checkpoints.iterdir() if not p.name.startswith("step_")]
    assert (scratch / "model" / "model.safetensors").is_file()  # the dead save's files
    assert [m["step"] for m in records(tmp_path / "split" / "metrics.jsonl")][:2] == [1, 2]

    resumed = run(
        ludic("train", *TRAIN_FLAGS, "--model", model, "--out-dir", "split", "--resume"),
        tmp_path,
    )
    assert "resumed at step 2" in resumed, resumed
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_00000002", "step_00000004"]
    finish(uninterrupted)

    split, whole = tmp_path / "split", tmp_path / "whole"
    steps = [(m["step"], m["loss"]) for m in records(split / "metrics.jsonl")]
    assert steps == [(m["step"], m["loss"]) for m in records(whole / "metrics.jsonl")]
    assert [step for step, _ in steps] == [1, 2, 3, 4]
    assert len(completions(split / "rollouts.jsonl")) == 4 * 2 * 3  # steps x problems x group size
    assert completions(split / "rollouts.jsonl") == completions(whole / "rollouts.jsonl")
    final_split, final_whole = _weights(split, 4), _weights(whole, 4)
    assert all(torch.equal(final_split[k], final_whole[k]) for k in final_whole)
    assert any(not torch.equal(_weights(split, 2)[k], final_split[k]) for k in final_split)

    evals = {}
    eval_flags = ("--env", "combo_say_o:SayOEnv", "--max-steps", "1", "--max-tokens", "8")
    running = {}
    for name in ("split", "whole"):
        checkpoint = str(tmp_path / name / "checkpoints" / "step_00000004")
        running[name] = start(
            ludic(
                "eval",
                "--model",
                checkpoint,
                *eval_flags,
                "--num-problems",
                "4",
                "--concurrency",
                "1",
                "--threads",
                "1",
                "--no-progress",
                "--out-dir",
                f"eval_{name}",
            ),
            tmp_path,
        )
    for name, process in running.items():
        finish(process)
        evals[name] = completions(tmp_path / f"eval_{name}" / "rollouts.jsonl")
    assert len(evals["split"]) == 4
    assert evals["split"] == evals["whole"]

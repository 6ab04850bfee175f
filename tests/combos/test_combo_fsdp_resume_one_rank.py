"""2 gloo ranks (torchrun, FSDP2) -> resumed on 1 process -> `ludic eval`, each a new process:
the README's multi-process program (`combo_fsdp_sft.py`: SFT on expert games, a checkpoint
every step) trained 2 steps on 2 ranks writes whole checkpoints (rank 0, HF format, tokenizer
included); the same program in one process resumes the 2-rank checkpoint, saying every rank
takes rank 0's position, and continues the step count and metrics.jsonl; `ludic eval --model`
loads the final checkpoint (its manifest verified) and plays it at its policy version."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from combo_processes import agent_steps, expert_games, free_port, ludic, program, records, run


def _sft(cwd: Path, steps: int, ranks: int) -> str:
    script = program("combo_fsdp_sft.py", "data/expert.jsonl", "out", str(steps))
    if ranks > 1:
        launch = ["-m", "torch.distributed.run", f"--nproc_per_node={ranks}"]
        launch += ["--master_addr=127.0.0.1", f"--master_port={free_port()}"]
        script = [sys.executable, *launch, *script[1:]]
    return run(script, cwd, TOKENIZERS_PARALLELISM="false")


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(1800)  # a chain of launches; the shared CI box is slow
def test_two_rank_checkpoint_resumed_on_one_process_then_evaluated(tmp_path: Path) -> None:
    expert_games(tmp_path)

    said = _sft(tmp_path, 2, ranks=2)
    assert "world size 2; resumed at step 0; out/checkpoints/step_00000002" in said, said
    model = tmp_path / "out" / "checkpoints" / "step_00000002" / "model"
    assert (model / "model.safetensors").is_file() and (model / "tokenizer.json").is_file()
    assert [m["step"] for m in records(tmp_path / "out" / "metrics.jsonl")] == [1, 2]

    said = _sft(tmp_path, 3, ranks=1)
    assert "step_00000002 was written by 2 ranks, resuming on 1" in said, said
    assert "world size 1; resumed at step 2; out/checkpoints/step_00000003" in said, said
    assert [m["step"] for m in records(tmp_path / "out" / "metrics.jsonl")] == [1, 2, 3]

    run(
        ludic(
            *("eval", "--env", "tictactoe", "--model", "out/checkpoints/step_00000003"),
            *("--num-problems", "2", "--samples-per-problem", "2", "--max-steps", "3"),
            *("--max-tokens", "8", "--out-dir", "eval", "--no-progress"),
        ),
        tmp_path,
        TOKENIZERS_PARALLELISM="false",
    )
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["episodes"] == 4
    steps = agent_steps(tmp_path / "eval" / "rollouts.jsonl")
    assert {s["policy_version"] for s in steps} == {3}

"""`ludic quickstart` refuses a flag value no stage can run with, naming the flag as typed,
before anything is built and before an earlier run's outputs in OUT_DIR are replaced.

Seen rerunning into an out-dir: `--opponent-epsilon 2` deleted the earlier run's eval/,
expert/, sft/ and rl/, then failed with `epsilon must be in [0, 1]` (which flag?);
`--expert-taken 1.5`, `--expert-epsilon -0.1` and `--max-tokens 0` failed only after the
first evaluation had run, in the env's and SamplingConfig's words; `--rl-steps 0` trained SFT,
evaluated, then failed plotting an empty reward curve (no table); `--rl-groups 0` and
`--group-size 1` ran to the end training on nothing. `--sft-steps 0` (GRPO from scratch) runs."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from ludic.errors import is_refusal
from ludic.recipes.configs import QuickstartConfig
from ludic.recipes.quickstart import check_flags, run_quickstart


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        (
            {"opponent_epsilon": 2.0},
            "--opponent-epsilon must be in [0, 1] (a probability), got 2.0",
        ),
        ({"expert_epsilon": -0.1}, "--expert-epsilon must be in [0, 1]"),
        ({"expert_taken": 1.5}, "--expert-taken must be in [0, 1]"),
        ({"max_tokens": 0}, "--max-tokens must be >= 1, got 0"),
        ({"rl_steps": 0}, "--rl-steps must be >= 1, got 0"),
        ({"sft_steps": -1}, "--sft-steps must be >= 0 (0: GRPO from scratch), got -1"),
        ({"eval_episodes": 0}, "--eval-episodes must be >= 1, got 0"),
        ({"sft_batch_size": 0}, "--sft-batch-size must be >= 1"),
        ({"rl_groups": 0}, "--rl-groups must be >= 1"),
        ({"group_size": 1}, "--group-size must be >= 2, got 1"),
        ({"rl_lr": -1.0}, "--rl-lr must be a positive number, got -1.0"),
        ({"sft_lr": math.nan}, "--sft-lr must be a positive number, got nan"),
        ({"eval_temperature": -1.0}, "--eval-temperature must be >= 0 (0: greedy), got -1.0"),
    ],
)
def test_a_value_no_stage_runs_with_is_refused_first_and_keeps_the_earlier_run(
    tmp_path: Path, flags: dict[str, float], refusal: str
) -> None:
    earlier = tmp_path / "rl" / "checkpoints" / "step_00000002"
    earlier.mkdir(parents=True)
    with pytest.raises(ValueError) as e:
        run_quickstart(QuickstartConfig(out_dir=tmp_path, progress=False, **flags))  # type: ignore[arg-type]
    assert refusal in str(e.value), str(e.value)
    assert is_refusal(e.value), str(e.value)
    assert earlier.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rl"]  # nothing built or written


def test_sft_steps_0_is_an_ablation_not_a_refusal() -> None:
    check_flags(QuickstartConfig(sft_steps=0))  # GRPO from the untrained model runs


def test_the_command_refuses_in_one_line_before_any_stage(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ludic.cli", "quickstart", "--expert-epsilon", "-0.1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode != 0
    assert "--expert-epsilon must be in [0, 1]" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "evaluate" not in result.stdout, result.stdout
    assert not (tmp_path / "ludic_runs" / "quickstart" / "eval").exists()

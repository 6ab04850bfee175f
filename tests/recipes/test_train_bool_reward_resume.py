"""A user's own env whose reward is a bool (`reward=solved`), through `ludic train --env
MODULE:CLASS` at temperature 0.7, then resumed: the env return checks read the bool as 1.0 /
0.0 (they refused it in a first version), the records hold float rewards, the first step of each
launch is on policy, and the resumed launch continues at the next step."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from ludic.recipes.configs import RESUME_LATEST, TrainConfig
from ludic.recipes.train import train_command


@pytest.mark.slow
def test_a_bool_reward_env_trains_at_temperature_07_and_resumes(tmp_path: Path) -> None:
    cfg = TrainConfig(
        env="train_envs:SaidOEnv",
        steps=2,
        problems_per_step=2,
        group_size=4,
        max_tokens=4,
        temperature=0.7,
        out_dir=tmp_path / "run",
        progress=False,
    )
    quiet = Console(file=open(tmp_path / "console.txt", "w"))  # noqa: SIM115
    try:
        train_command(cfg, console=quiet)
        resumed = train_command(replace(cfg, steps=3, resume=RESUME_LATEST), console=quiet)
    finally:
        quiet.file.close()
    assert resumed.steps == 1 and resumed.checkpoint.name.endswith("3")  # this launch: step 3
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert all(row["batch/num_failed"] == 0 for row in rows)
    assert all(row["loss/mismatch/abs_log_ratio_max"] < 1e-3 for row in rows)
    rewards = [
        step["reward"]
        for line in (tmp_path / "run" / "rollouts.jsonl").open()
        for step in json.loads(line)["steps"]
        if "reward" in step
    ]
    assert rewards and all(type(r) is float and r in (0.0, 1.0) for r in rewards)

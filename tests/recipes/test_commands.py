"""`ludic train` and `ludic sft` as functions, on tiny budgets."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from ludic.inference import ScriptedClient
from ludic.models import build_tiny_model
from ludic.recipes.configs import SFTConfig, TrainConfig
from ludic.recipes.expert import PolicyClient
from ludic.recipes.sft import sft_command
from ludic.recipes.tictactoe import (
    ENV_NAME,
    PROTOCOL_NAME,
    expert_policy,
    rollout_engine,
)
from ludic.recipes.train import train_command
from ludic.rollouts import ComponentSpec, RolloutRequest, SeedSequencer, write_rollouts_jsonl


def play(client: object, path: Path, games: int = 6) -> Path:
    requests = [
        RolloutRequest(env=ComponentSpec(name=ENV_NAME), protocol=ComponentSpec(name=PROTOCOL_NAME))
        for _ in range(games)
    ]
    engine = rollout_engine(client)  # type: ignore[arg-type]
    rollouts = asyncio.run(engine.run(SeedSequencer(run_seed=0).seed_requests(requests, 0)))
    with path.open("w") as f:
        write_rollouts_jsonl(rollouts, f)
    return path


@pytest.fixture(scope="module")
def expert_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = build_tiny_model()[1]  # the tokenizer `ludic sft` uses without --model
    path = tmp_path_factory.mktemp("data") / "expert.jsonl"
    return play(PolicyClient(expert_policy(0.0), tokenizer), path)


@pytest.mark.slow
def test_train_command_runs_grpo_and_writes_its_outputs(tmp_path: Path) -> None:
    cfg = TrainConfig(
        env="tictactoe",
        env_kwargs='{"opponent": "random"}',
        context="latest",
        steps=2,
        problems_per_step=2,
        group_size=2,
        max_tokens=10,
        lr=1e-3,
        out_dir=tmp_path,
        progress=False,
    )
    result = train_command(cfg)
    assert result.steps == 2
    assert result.checkpoint.name == "step_00000002"
    assert (result.checkpoint / "model" / "config.json").is_file()
    assert result.reward_curve_png.is_file()
    lines = (tmp_path / "rollouts.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 2 * 2  # steps x problems x group size
    # named as --env named it (was "env" for every env)
    assert {json.loads(line)["meta"]["env_name"] for line in lines} == {cfg.env}


def test_train_command_refuses_multi_seat_envs_and_bad_kwargs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="2 seats"):
        train_command(TrainConfig(env="tictactoe_duel", out_dir=tmp_path))
    with pytest.raises(ValueError, match="JSON object"):
        train_command(TrainConfig(env_kwargs="[1]", out_dir=tmp_path))
    with pytest.raises(ValueError, match="unknown env"):
        train_command(TrainConfig(env="no_such_env", out_dir=tmp_path))


def test_sft_command_fits_expert_moves(expert_data: Path, tmp_path: Path) -> None:
    cfg = SFTConfig(
        data=expert_data, steps=4, batch_size=8, lr=3e-3, out_dir=tmp_path, progress=False
    )
    result = sft_command(cfg)
    assert result.steps == 4 and result.last_loss < result.first_loss
    assert (result.checkpoint / "model" / "tokenizer.json").is_file()
    assert (tmp_path / "loss_curve.png").is_file()


def test_sft_min_reward_filters_whole_episodes(expert_data: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no samples"):
        sft_command(
            SFTConfig(data=expert_data, steps=1, min_reward=5.0, out_dir=tmp_path, progress=False)
        )


def test_sft_retokenizes_rollouts_from_another_tokenizer(tmp_path: Path) -> None:
    # ScriptedClient ids are bytes, not the tiny tokenizer's: --retokenize rebuilds them.
    data = play(
        ScriptedClient(["<move>5</move>", "<move>1</move>", "<move>9</move>"]), tmp_path / "d.jsonl"
    )
    cfg = SFTConfig(
        data=data,
        steps=3,
        batch_size=4,
        lr=3e-3,
        retokenize=True,
        out_dir=tmp_path / "o",
        progress=False,
    )
    assert sft_command(cfg).steps == 3


def test_sft_refuses_ids_from_another_smaller_tokenizer(tmp_path: Path) -> None:
    # byte ids fit the tiny vocabulary, so only decoding them shows they are another
    # tokenizer's (the quickstart's kept.jsonl on a model without --model did the same)
    data = play(ScriptedClient(["<move>5</move>", "<move>1</move>"]), tmp_path / "d.jsonl")
    cfg = SFTConfig(data=data, steps=1, out_dir=tmp_path / "o", progress=False)
    with pytest.raises(ValueError, match=r"another tokenizer.*--model.*--retokenize"):
        sft_command(cfg)
    assert not (tmp_path / "o" / "checkpoints").exists()


def test_sft_accepts_ids_whose_recorded_text_keeps_a_special_token(
    expert_data: Path, tmp_path: Path
) -> None:
    # a backend may record special tokens in the text (e.g. a chat end marker): still its ids
    data = tmp_path / "with_eos.jsonl"
    eos = build_tiny_model()[1].eos_token
    with data.open("w") as out:
        for line in expert_data.read_text().splitlines():
            record = json.loads(line)
            for step in record["steps"]:
                if step["kind"] == "agent":
                    step["completion"] += eos
            out.write(json.dumps(record) + "\n")
    cfg = SFTConfig(data=data, steps=1, batch_size=4, out_dir=tmp_path / "o", progress=False)
    assert sft_command(cfg).steps == 1


def test_sft_needs_a_data_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="rollouts JSONL"):
        sft_command(SFTConfig(data=tmp_path / "missing.jsonl", out_dir=tmp_path))

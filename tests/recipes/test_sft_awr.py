"""`ludic sft --algorithm awr`: advantage-weighted regression on a rollouts JSONL, from the
command line to the weights the trainer sees."""

from __future__ import annotations

import asyncio
import io
import json
import math
import random
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import tyro
from rich.console import Console

from ludic.cli import main as cli_main
from ludic.models import build_tiny_model
from ludic.recipes.configs import SFTConfig
from ludic.recipes.expert import PolicyClient
from ludic.recipes.sft import (
    min_episode_return,
    offline_algorithm,
    sft_command,
    turn_has_parse_error,
)
from ludic.recipes.tictactoe import ENV_NAME, PROTOCOL_NAME, expert_policy, rollout_engine
from ludic.rollouts import ComponentSpec, RolloutRequest, SeedSequencer, write_rollouts_jsonl
from ludic.training import AWRCredit, OfflineBatchSource, drop_parse_errors, make_sft
from ludic.training.credit import group_normalize, group_rollouts
from ludic.types import Rollout


def play(epsilon: float, path: Path, games: int) -> Path:
    client = PolicyClient(expert_policy(epsilon), build_tiny_model()[1])
    requests = [
        RolloutRequest(env=ComponentSpec(name=ENV_NAME), protocol=ComponentSpec(name=PROTOCOL_NAME))
        for _ in range(games)
    ]
    engine = rollout_engine(client)
    rollouts = asyncio.run(engine.run(SeedSequencer(run_seed=3).seed_requests(requests, 0)))
    with path.open("w") as f:
        write_rollouts_jsonl(rollouts, f)
    return path


@pytest.fixture(scope="module")
def mixed_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sloppy expert (random moves 80% of the time): wins, draws and losses."""
    path = play(0.8, tmp_path_factory.mktemp("data") / "mixed.jsonl", games=12)
    returns = {round(Rollout.from_dict(json.loads(line)).total_reward, 6) for line in path.open()}
    assert len(returns) > 1, "the fixture needs episodes with different returns"
    return path


def test_the_cli_flags_build_the_awr_preset() -> None:
    args = [
        "--data",
        "x.jsonl",
        "--algorithm",
        "awr",
        "--awr-beta",
        "0.5",
        "--awr-baseline",
        "mean",
    ]
    cfg = tyro.cli(SFTConfig, args=args)
    algorithm = offline_algorithm(cfg)
    assert algorithm.name == "awr"
    assert algorithm.credit_assigner == AWRCredit(beta=0.5, max_weight=20.0, baseline="mean")
    assert offline_algorithm(tyro.cli(SFTConfig, args=["--data", "x.jsonl"])).name == "sft"
    state = ["--data", "x.jsonl", "--algorithm", "awr", "--awr-baseline", "state"]
    cfg = tyro.cli(SFTConfig, args=[*state, "--awr-state-prior", "2"])
    assert offline_algorithm(cfg).credit_assigner == AWRCredit(baseline="state", state_prior=2.0)
    pairs = ["--data", "x.jsonl", "--algorithm", "awr", "--awr-baseline", "state_action"]
    credit = offline_algorithm(tyro.cli(SFTConfig, args=pairs)).credit_assigner
    assert credit == AWRCredit(baseline="state_action")
    normalized = offline_algorithm(tyro.cli(SFTConfig, args=[*pairs, "--awr-state-normalize"]))
    credit = normalized.credit_assigner
    assert isinstance(credit, AWRCredit) and credit.trained is not None
    assert replace(credit, trained=None) == AWRCredit(baseline="state_action", state_normalize=True)


def garbling_policy(epsilon: float, garble: float) -> Callable[[Any, random.Random], str]:
    """`expert_policy(epsilon)`, but an unparseable reply with probability `garble` (the env
    shows the same board again, so the retry shares the garbled turn's state)."""
    expert = expert_policy(epsilon)

    def policy(messages: Any, rng: random.Random) -> str:
        return "no move here" if rng.random() < garble else expert(messages, rng)

    return policy


def test_state_normalize_averages_one_over_the_turns_ludic_sft_trains(tmp_path: Path) -> None:
    """Parse-error turns are dropped after credit (drop_parse_errors) and share their board
    with the retry; the kept turns of every board must still average weight 1."""
    client = PolicyClient(garbling_policy(0.8, 0.3), build_tiny_model()[1])
    spec = RolloutRequest(
        env=ComponentSpec(name=ENV_NAME), protocol=ComponentSpec(name=PROTOCOL_NAME)
    )
    engine = rollout_engine(client)
    rollouts = asyncio.run(engine.run(SeedSequencer(run_seed=5).seed_requests([spec] * 24, 0)))
    data = tmp_path / "garbled.jsonl"
    write_rollouts_jsonl(rollouts, data)
    args = ["--data", str(data), "--algorithm", "awr", "--awr-baseline", "state_action"]
    cfg = tyro.cli(SFTConfig, args=[*args, "--awr-beta", "0.25", "--awr-state-normalize"])
    algorithm = offline_algorithm(cfg)
    source = OfflineBatchSource(
        paths=data,
        credit_assigner=algorithm.credit_assigner,
        batch_size=4,
        filters=[drop_parse_errors()],
    )
    assert source.num_filtered_out > 0, "the data needs parse errors"
    by_state: dict[object, list[float]] = {}
    for sample in source.samples:
        by_state.setdefault(sample.meta["state_key"], []).append(float(sample.weight))
    assert len(by_state) > 5 and any(len(ws) > 1 for ws in by_state.values())
    for weights in by_state.values():
        assert sum(weights) / len(weights) == pytest.approx(1.0, rel=1e-9)
    # the turn-level rule is the sample filter's: same verdict on every turn
    unfiltered = OfflineBatchSource(paths=data, credit_assigner=AWRCredit(), batch_size=4)
    turns = {(r.id, t.turn_id): t for r in rollouts for t in r.turns()}
    for sample in unfiltered.samples:
        turn = turns[(sample.meta["rollout_id"], sample.meta["turn_id"])]
        assert turn_has_parse_error(turn) == sample.meta["parse_error"]


def test_awr_weights_of_the_samples_are_exp_of_group_advantages(mixed_data: Path) -> None:
    # weight = min(exp((R_i - mean_group R) / beta), 20) for every turn of episode i
    credit = AWRCredit(beta=0.5)
    source = OfflineBatchSource(paths=mixed_data, credit_assigner=credit, batch_size=4)
    rollouts = [Rollout.from_dict(json.loads(line)) for line in mixed_data.open()]
    expected: dict[str, float] = {}
    for members in group_rollouts(rollouts).values():
        returns = [math.fsum(t.reward for t in turns) for _, turns in members]
        advantages = group_normalize(returns, normalize_std=False, eps=1e-6)
        for (rollout, _), a in zip(members, advantages, strict=True):
            expected[rollout.id] = min(math.exp(a / 0.5), 20.0)
    weights = {s.meta["rollout_id"]: s.weight for s in source.samples}
    assert weights == pytest.approx({rid: expected[rid] for rid in weights}, abs=1e-9)
    assert len(set(weights.values())) > 1


@pytest.mark.slow
def test_ludic_sft_algorithm_awr_trains_from_the_command_line(
    mixed_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "awr"
    cli_main(
        [
            "sft",
            "--data",
            str(mixed_data),
            "--algorithm",
            "awr",
            "--steps",
            "3",
            "--batch-size",
            "8",
            "--lr",
            "3e-3",
            "--out-dir",
            str(out),
            "--no-progress",
        ]
    )
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3
    assert sorted((out / "checkpoints").glob("step_*/model/config.json"))
    # the trainer saw AWR weights (not SFT's 1.0): exp(A / 1) of mixed returns
    assert any(abs(r["weight_mean"] - 1.0) > 1e-3 for r in records)


def test_awr_on_equal_rewards_warns_that_it_is_plain_sft(tmp_path: Path) -> None:
    data = play(0.0, tmp_path / "perfect.jsonl", games=4)  # minimax never loses to random
    rewards = {Rollout.from_dict(json.loads(line)).total_reward for line in data.open()}
    if len(rewards) != 1:
        pytest.skip(f"the expert's games did not all end alike: {rewards}")
    buffer = io.StringIO()
    cfg = SFTConfig(data=data, algorithm="awr", steps=1, out_dir=tmp_path / "o", progress=False)
    sft_command(cfg, console=Console(file=buffer, width=200))
    assert "every AWR weight is equal, so this is plain SFT" in buffer.getvalue()
    assert re.search(r"AWR done: loss \S+ -> \S+ over 1 step\. Model:", buffer.getvalue())
    assert make_sft().name == "sft"


def test_the_cli_flags_build_the_value_baseline_and_the_normalisations() -> None:
    base = ["--data", "x.jsonl", "--algorithm", "awr", "--awr-baseline", "value"]
    credit = offline_algorithm(tyro.cli(SFTConfig, args=[*base, "--awr-value-folds", "3"]))
    assert credit.credit_assigner == AWRCredit(baseline="value", value_folds=3)
    flags = [*base, "--awr-normalize-mean", "--awr-min-weight", "0.5"]
    normalized = offline_algorithm(tyro.cli(SFTConfig, args=flags)).credit_assigner
    assert isinstance(normalized, AWRCredit) and normalized.trained is not None
    expected = AWRCredit(baseline="value", normalize_mean=True, min_weight=0.5)
    assert replace(normalized, trained=None) == expected


def test_filter_then_reweight_weights_from_every_episode_mean_one_on_the_kept(
    mixed_data: Path,
) -> None:
    """`--algorithm awr --min-reward 0 --awr-normalize-mean`: the value baseline is fitted on
    every episode, only the episodes with return >= 0 train, and their turns average 1."""
    args = ["--data", str(mixed_data), "--algorithm", "awr", "--awr-baseline", "value"]
    cfg = tyro.cli(SFTConfig, args=[*args, "--awr-normalize-mean", "--min-reward", "0"])
    credit = offline_algorithm(cfg).credit_assigner
    rollouts = [Rollout.from_dict(json.loads(line)) for line in mixed_data.open()]
    source = OfflineBatchSource(
        paths=mixed_data,
        credit_assigner=credit,
        batch_size=4,
        filters=[drop_parse_errors(), min_episode_return(0.0)],
    )
    kept = {r.id for r in rollouts if r.total_reward >= 0}
    assert 0 < len(kept) < len(rollouts), "the fixture needs kept and dropped episodes"
    assert {s.meta["rollout_id"] for s in source.samples} <= kept
    weights = [float(s.weight) for s in source.samples]
    assert sum(weights) / len(weights) == pytest.approx(1.0, rel=1e-9)
    assert len(set(weights)) > 1
    # the weights are those of the credit on every episode (the dropped ones fit the value)
    everything = credit.assign(rollouts)
    for sample in source.samples:
        key = (sample.meta["rollout_id"], sample.meta["turn_id"])
        assert float(sample.weight) == pytest.approx(everything[key], rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("baseline", ["value", "q_value"])
def test_ludic_sft_awr_value_baseline_filter_then_reweight_from_the_command_line(
    mixed_data: Path, tmp_path: Path, baseline: str
) -> None:
    out = tmp_path / "awr_value"
    flags = ["--awr-baseline", baseline, "--awr-value-folds", "3", "--awr-normalize-mean"]
    cli_main(
        [
            "sft",
            "--data",
            str(mixed_data),
            "--algorithm",
            "awr",
            *flags,
            "--awr-min-weight",
            "0.25",
            "--min-reward",
            "0",
            "--steps",
            "2",
            "--batch-size",
            "4",
            "--out-dir",
            str(out),
            "--no-progress",
        ]
    )
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2
    assert sorted((out / "checkpoints").glob("step_*/model/config.json"))
    assert all(r["weight_mean"] >= 0.25 for r in records)  # the floor holds in every batch


def test_the_cli_flag_builds_the_q_value_baseline() -> None:
    """`--awr-baseline q_value`: learned Q(s, a) - V(s), with the value folds and the defaults
    of the Python API (Q over the observation and the action)."""
    args = ["--data", "x.jsonl", "--algorithm", "awr", "--awr-baseline", "q_value"]
    credit = offline_algorithm(tyro.cli(SFTConfig, args=[*args, "--awr-value-folds", "3"]))
    assert credit.credit_assigner == AWRCredit(baseline="q_value", value_folds=3)

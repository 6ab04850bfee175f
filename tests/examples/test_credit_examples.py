"""Smoke tests of the AWR and delegation examples on tiny budgets, and of the claim that one
delegation batch trains the boss and its helper in the same optimizer step."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from test_examples import config, load_example

from ludic.models import TinyModelSpec, build_tiny_model
from ludic.recipes.expert import PolicyClient
from ludic.recipes.training import make_trainer
from ludic.rollouts import GRPORequestStrategy, SeedSequencer
from ludic.training import HierarchicalCredit, RLAlgorithm, RolloutBatchSource, make_grpo


@pytest.mark.slow
def test_awr_tictactoe(tmp_path: Path) -> None:
    example = load_example("awr_tictactoe.py")
    cfg = config(
        example,
        "AWRConfig",
        expert_episodes=16,
        steps=2,
        batch_size=8,
        eval_episodes=4,
        hidden_size=64,
        seeds=1,
        out_dir=tmp_path,
    )
    result = example.main(cfg)
    assert [len(result["sft"]), len(result["awr"])] == [1, 1]
    for stage in (*result["sft"], *result["awr"]):
        assert stage.episodes == 4
        assert stage.win + stage.draw + stage.loss == pytest.approx(1.0)
    summary = json.loads((tmp_path / "results.json").read_text())["summary"]
    assert set(summary) == {"sft", "awr"}
    # rejection sampling dropped the lost games; AWR kept every game
    sft_metrics = (tmp_path / "seed_0" / "sft" / "metrics.jsonl").read_text().splitlines()
    awr_metrics = (tmp_path / "seed_0" / "awr" / "metrics.jsonl").read_text().splitlines()
    assert len(sft_metrics) == len(awr_metrics) == 2


@pytest.mark.slow
def test_delegation_train(tmp_path: Path) -> None:
    example = load_example("delegation/train.py")
    cfg = config(
        example,
        "DelegationConfig",
        demo_episodes=8,
        sft_steps=2,
        rl_steps=2,
        problems=2,
        group_size=2,
        eval_episodes=4,
        hidden_size=32,
        out_dir=tmp_path,
    )
    result = example.main(cfg)
    assert len(result["history"]) == 2 and result["history"][-1]["policy_version"] == 4
    for stage in ("before", "after"):
        assert set(result[stage]) == {"boss_reward", "helper_reward", "delegation_rate"}
    demos = [json.loads(line) for line in (tmp_path / "demos.jsonl").read_text().splitlines()]
    assert {d["agent_id"] for d in demos} == {"agent_0", "helper"}  # SFT saw both roles


def test_one_delegation_batch_trains_boss_and_helper_together(tmp_path: Path) -> None:
    example = load_example("delegation/train.py")
    model, tokenizer = build_tiny_model(seed=0, spec=TinyModelSpec(hidden_size=32))
    client = PolicyClient(example.scripted_expert(0.5), tokenizer)
    credit = HierarchicalCredit(mode="inherit")
    source = RolloutBatchSource(
        engine=example.rollout_engine(client, jsonl_log=tmp_path / "rollouts.jsonl"),
        requests_fn=lambda: example.requests(2),
        credit_assigner=credit,
        strategy=GRPORequestStrategy(group_size=2),
        seed_sequencer=SeedSequencer(run_seed=0),
    )
    algorithm = RLAlgorithm(name="h", credit_assigner=credit, loss=make_grpo().loss)
    trainer = make_trainer(model, tokenizer, algorithm, source, out=tmp_path, lr=1e-3)
    (record,) = asyncio.run(trainer.train(1, progress=False))
    # 2 problems x 2 boss episodes, each delegating once: 4 boss + 4 helper rollouts; the
    # boss's delegate call and answer are one turn (one sample), the helper's its own -> 8
    assert record["batch/num_rollouts"] == 8 and record["num_samples"] == 8
    rollouts = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    helpers = [r for r in rollouts if r["agent_id"] == "helper"]
    assert len(helpers) == 4 and all(r["meta"]["parent_rollout_id"] for r in helpers)

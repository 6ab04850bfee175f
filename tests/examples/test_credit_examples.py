"""Smoke tests of the AWR and delegation examples on tiny budgets, and of the claim that one
delegation batch trains the boss and its helper in the same optimizer step."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from test_examples import config, load_example

from ludic.models import TinyModelSpec, build_tiny_model
from ludic.recipes.expert import PolicyClient
from ludic.recipes.tictactoe import StageResult, drop_penalised_turns
from ludic.recipes.training import make_trainer
from ludic.rollouts import GRPORequestStrategy, SeedSequencer
from ludic.training import (
    HierarchicalCredit,
    OfflineBatchSource,
    RLAlgorithm,
    RolloutBatchSource,
    make_grpo,
)
from ludic.types import AgentStep, EnvironmentStep, Rollout, Turn


def hand_awr_weights(path: Path, *, beta: float, cap: float, prior: float) -> dict:
    """AWR weights with the per-state baseline, written out from the formula: A_k = G_k -
    (sum of the other visits' G + prior * mean G) / (visits - 1 + prior), w = min(e^(A/beta), cap)."""
    rollouts = [Rollout.from_dict(json.loads(line)) for line in path.open()]
    turns = []  # (key, return-to-go, state)
    for rollout in rollouts:
        rewards = [t.reward for t in rollout.turns()]
        for i, turn in enumerate(rollout.turns()):
            turns.append(((rollout.id, turn.turn_id), sum(rewards[i:]), turn.state_key))
    mean = sum(g for _, g, _ in turns) / len(turns)
    weights = {}
    for key, g, state in turns:
        others = [h for k, h, s in turns if s == state and k != key]
        value = (sum(others) + prior * mean) / (len(others) + prior)
        weights[key] = min(math.exp((g - value) / beta), cap)
    return weights


@pytest.mark.slow
def test_awr_tictactoe(tmp_path: Path) -> None:
    """Both stages on a tiny budget: mixed-quality players, the start model's own games, sft
    on the kept games only, awr on every game with the formula's weights."""
    example = load_example("awr_tictactoe.py")
    cfg = config(
        example,
        "AWRConfig",
        expert_episodes=16,
        expert_epsilons=(0.0, 1.0),
        expert_taken=0.25,  # illegal moves: graded returns, and turns both methods leave out
        self_episodes=6,
        steps=2,
        continue_steps=3,
        batch_size=8,
        eval_episodes=4,
        hidden_size=64,
        seeds=2,
        out_dir=tmp_path,
    )
    result = example.main(cfg)
    assert {m: len(stages) for m, stages in result.items()} == {"start": 2, "sft": 2, "awr": 2}
    for stage in (s for stages in result.values() for s in stages):
        assert stage.episodes == 4
        assert stage.win + stage.draw + stage.loss == pytest.approx(1.0)
    record = json.loads((tmp_path / "results.json").read_text())
    assert set(record["summary"]) == {"start", "sft", "awr", "awr - sft"}
    runs = record["runs"]
    diffs = [a["win"] - s["win"] for a, s in zip(runs["awr"], runs["sft"], strict=True)]
    assert record["summary"]["awr - sft"]["win"]["mean"] == pytest.approx(sum(diffs) / 2)
    data = tmp_path / "seed_0" / "data"
    every = [Rollout.from_dict(json.loads(line)) for line in (data / "all.jsonl").open()]
    kept = [Rollout.from_dict(json.loads(line)) for line in (data / "kept.jsonl").open()]
    assert len(every) == 16 + 6 == record["data"][0]["games"]  # expert games + its own
    assert {r.id for r in kept} == {r.id for r in every if example.won_or_drew(r)}
    assert len(kept) < len(every), "the random player should lose some games"
    for run in ("start", "sft", "awr"):  # stage 1 on 2 steps, then 3 steps of each method
        lines = (tmp_path / "seed_0" / run / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == (2 if run == "start" else 3)
    # the weights the awr run trains on are the formula's; illegal turns are left out
    algo = example.algorithm(cfg, "awr")
    source = OfflineBatchSource(
        paths=data / "all.jsonl",
        credit_assigner=algo.credit_assigner,
        batch_size=8,
        filters=[drop_penalised_turns],
    )
    hand = hand_awr_weights(data / "all.jsonl", beta=cfg.beta, cap=cfg.max_weight, prior=1.0)
    for sample in source.samples:
        key = (sample.meta["rollout_id"], sample.meta["turn_id"])
        assert float(sample.weight) == pytest.approx(hand[key], rel=1e-9)
        assert sample.meta["reward"] >= 0
    assert len({round(float(s.weight), 9) for s in source.samples}) > 2


def test_awr_example_interval_uses_n_minus_1_degrees_of_freedom() -> None:
    example = load_example("awr_tictactoe.py")
    # 2 values: stdev sqrt(2), t(1 d.o.f.) = 12.706, half = 12.706 * sqrt(2) / sqrt(2)
    assert example.interval([1.0, 3.0]) == {"mean": 2.0, "ci95": pytest.approx(12.706), "n": 2}
    # 3 values: stdev 1, t(2) = 4.303
    three = example.interval([1.0, 2.0, 3.0])
    assert three["ci95"] == pytest.approx(4.303 / math.sqrt(3))
    # 11 values (10 d.o.f.) and 12 (11 d.o.f.: 2.201, not the 10-d.o.f. value)
    eleven = [float(i % 2) for i in range(11)]
    sd = statistics.stdev(eleven)
    assert example.interval(eleven)["ci95"] == pytest.approx(2.228 * sd / math.sqrt(11))
    twelve = [float(i % 2) for i in range(12)]
    sd = statistics.stdev(twelve)
    assert example.interval(twelve)["ci95"] == pytest.approx(2.201 * sd / math.sqrt(12))
    assert example.interval([5.0]) == {"mean": 5.0, "ci95": None, "n": 1}  # no interval


def test_awr_example_plays_every_expert_game_and_refuses_no_players() -> None:
    example = load_example("awr_tictactoe.py")
    assert example.expert_shares(999, 3) == [333, 333, 333]
    assert example.expert_shares(1000, 3) == [334, 333, 333]
    assert example.expert_shares(5, 2) == [3, 2]
    with pytest.raises(ValueError, match="--expert-epsilons needs at least one value"):
        example.expert_shares(10, 0)
    with pytest.raises(ValueError, match="--expert-episodes 1 is fewer than the 2"):
        example.expert_shares(1, 2)
    cfg = config(example, "AWRConfig", expert_episodes=7, expert_epsilons=(0.0, 1.0))
    tokenizer = build_tiny_model(spec=TinyModelSpec(hidden_size=32))[1]
    assert len(asyncio.run(example.expert_games(cfg, tokenizer, 0))) == 7
    with pytest.raises(ValueError, match="--expert-epsilons"):
        example.main(config(example, "AWRConfig", expert_epsilons=()))


def test_awr_example_repeated_epsilons_set_the_expert_share() -> None:
    """`--expert-epsilons 0 1 1 1` is one minimax game in four (the README's share sweep):
    the first quarter of the games is the minimax player's (every move optimal, never lost)."""
    example = load_example("awr_tictactoe.py")
    cfg = config(example, "AWRConfig", expert_episodes=8, expert_epsilons=(0.0, 1.0, 1.0, 1.0))
    tokenizer = build_tiny_model(spec=TinyModelSpec(hidden_size=32))[1]
    games = asyncio.run(example.expert_games(cfg, tokenizer, 0))
    assert len(games) == 8

    def optimal(game: Rollout) -> list[bool]:
        return [bool(t.env_step and t.env_step.info.get("optimal_move")) for t in game.turns()]

    assert all(all(optimal(g)) and example.won_or_drew(g) for g in games[:2])
    assert not all(all(optimal(g)) for g in games[2:])  # the random players' share


def test_awr_example_state_normalize_averages_one_over_the_trained_turns() -> None:
    """Illegal moves are dropped after credit and share their board with the retry; with
    --state-normalize every board's trained turns average weight 1."""
    example = load_example("awr_tictactoe.py")
    cfg = config(
        example,
        "AWRConfig",
        expert_episodes=40,
        expert_epsilons=(0.0, 1.0),
        expert_taken=0.3,
        baseline="state_action",
        beta=0.25,
        state_normalize=True,
    )
    tokenizer = build_tiny_model(spec=TinyModelSpec(hidden_size=32))[1]
    rollouts = asyncio.run(example.expert_games(cfg, tokenizer, 0))
    credit = example.algorithm(cfg, "awr").credit_assigner
    weights = credit.assign(rollouts)
    by_state: dict[object, list[float]] = {}
    dropped = 0
    for rollout in rollouts:
        for turn in rollout.turns():
            if turn.reward < 0:  # what drop_penalised_turns leaves out
                dropped += 1
                continue
            by_state.setdefault(turn.state_key, []).append(weights[(rollout.id, turn.turn_id)])
    assert dropped > 0 and any(len(ws) > 1 for ws in by_state.values())
    for ws in by_state.values():
        assert sum(ws) / len(ws) == pytest.approx(1.0, rel=1e-9)


@pytest.mark.slow
def test_awr_example_filter_then_reweight_with_the_value_baseline(tmp_path: Path) -> None:
    """--baseline value --awr-games kept --normalize-mean: the value is fitted on every game,
    awr trains only on the won or drawn games' legal moves, and those average weight 1."""
    example = load_example("awr_tictactoe.py")
    cfg = config(
        example,
        "AWRConfig",
        expert_episodes=30,
        expert_epsilons=(0.0, 1.0),
        expert_taken=0.3,
        baseline="value",
        value_folds=3,
        awr_games="kept",
        normalize_mean=True,
    )
    tokenizer = build_tiny_model(spec=TinyModelSpec(hidden_size=32))[1]
    rollouts = asyncio.run(example.expert_games(cfg, tokenizer, 0))
    all_path, _ = example.write_data(rollouts, tmp_path)
    algo = example.algorithm(cfg, "awr")
    source = example.training_source(cfg, algo, all_path, 0)
    kept = {r.id for r in rollouts if example.won_or_drew(r)}
    assert 0 < len(kept) < len(rollouts), "the random player should lose some games"
    assert {s.meta["rollout_id"] for s in source.samples} <= kept
    assert all(s.meta["reward"] >= 0 for s in source.samples)
    weights = [float(s.weight) for s in source.samples]
    assert sum(weights) / len(weights) == pytest.approx(1.0, rel=1e-6)
    assert len({round(w, 6) for w in weights}) > 2
    everything = algo.credit_assigner.assign(rollouts)  # the same weights, from every game
    for sample in source.samples:
        key = (sample.meta["rollout_id"], sample.meta["turn_id"])
        assert float(sample.weight) == pytest.approx(everything[key], rel=1e-6)
    # sft trains the legal moves of kept games at weight 1: ESS = kept legal / all legal
    report = example.weight_report(cfg, rollouts)
    legal = [
        r.id in kept
        for r in rollouts
        for t in r.turns()
        if t.env_step is not None and t.agent_steps and not t.env_step.info.get("illegal_move")
    ]
    assert report["sft"]["ess"] == pytest.approx(sum(legal) / len(legal))
    assert 0 < report["awr"]["ess"] <= report["sft"]["ess"] + 1e-9
    assert report["awr"]["baseline_r2"] <= 1.0
    sft_source = example.training_source(cfg, example.algorithm(cfg, "sft"), all_path, 0)
    assert len(sft_source.samples) > len(source.samples)  # sft on all.jsonl would keep all


def test_awr_example_board_features_are_symmetric_and_read_the_afterstate() -> None:
    """--features board: V sees the board and Q the board the move leads to, each the same for
    the 8 symmetric images of a position; an illegal move gets an id of its own."""
    example = load_example("awr_tictactoe.py")
    assert example.canonical("X........") == example.canonical("........X")  # corners
    assert example.canonical("X........") != example.canonical(".X.......")  # corner, edge
    assert len({example.canonical(b) for b in ("XO.......", "X..O.....", "..X.O....")}) == 2

    def turn(observation: str, info: dict) -> Turn:
        agent = AgentStep(turn_id="t", info={"observation": observation})
        env = EnvironmentStep(turn_id="t", action="", info=info, agent_step_ids=(agent.id,))
        return Rollout(steps=[agent, env]).turns()[0]

    board = "O|2|3\n4|5|6\n7|X|9\nX to move"  # O on 1, X on 8: X to move
    after = example.afterstate_features(turn(board, {"move": 9}))
    assert after == example.cell_features(example.canonical("O......XX"))
    # the same afterstate reached from the mirror image (O on 3, X on 8, X plays 7)
    mirror = "1|2|O\n4|5|6\n7|X|9\nX to move"
    assert example.afterstate_features(turn(mirror, {"move": 7})) == after
    assert example.board_features(turn(board, {"move": 9})) == example.cell_features(
        example.canonical("O......X.")
    )
    illegal = turn(board, {"move": 1, "illegal_move": True})
    assert example.afterstate_features(illegal) == [("illegal", example.canonical("O......X."))]
    cfg = config(example, "AWRConfig", baseline="q_value", features="board")
    credit = example.algorithm(cfg, "awr").credit_assigner
    assert credit.featurize is example.board_features
    assert credit.featurize_action is example.afterstate_features
    text = example.algorithm(config(example, "AWRConfig", baseline="q_value"), "awr")
    assert text.credit_assigner.featurize_action is not example.afterstate_features


@pytest.mark.slow
def test_awr_example_q_value_on_board_features_prefers_the_optimal_moves() -> None:
    """On games of a minimax and a random player, learned Q - V over afterstates gives the
    optimal moves of the won and drawn games more weight than the other moves (the filter
    alone cannot: it keeps every move of those games)."""
    example = load_example("awr_tictactoe.py")
    cfg = config(
        example,
        "AWRConfig",
        expert_episodes=200,
        expert_epsilons=(0.0, 1.0),
        baseline="q_value",
        features="board",
        value_folds=3,
        awr_games="kept",
        normalize_mean=True,
    )
    tokenizer = build_tiny_model(spec=TinyModelSpec(hidden_size=32))[1]
    rollouts = asyncio.run(example.expert_games(cfg, tokenizer, 0))

    def optimal_over_other(features: str) -> tuple[float, float]:
        report = example.weight_report(replace(cfg, features=features), rollouts)
        awr, sft = report["awr"], report["sft"]
        assert "baseline_r2" not in awr  # A = Q - V is not a residual of the return
        return awr["optimal"] / awr["other"], sft["optimal"] / sft["other"]

    board, sft = optimal_over_other("board")
    text, _ = optimal_over_other("text")  # Q over the text and the move: it generalises less
    assert board > 1.4 * sft  # measured 2.73 against the filter's 1.75
    assert board > 1.1 * text  # measured 2.29


def test_awr_example_summarises_one_method_without_the_paired_difference() -> None:
    """--methods awr (a second call adding awr runs to the same data): no awr - sft row."""
    example = load_example("awr_tictactoe.py")

    def record(win: float) -> dict:
        stage = StageResult(
            stage="awr", episodes=4, win=win, draw=0.0, loss=1 - win, illegal=0.1, mean_reward=0
        )
        return {"awr": stage}

    summary = example.summarise([record(0.5), record(0.75)])
    assert set(summary) == {"awr"}
    assert summary["awr"]["win"]["mean"] == pytest.approx(0.625)
    assert config(example, "AWRConfig", methods=("awr",)).methods == ("awr",)


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


def test_delegation_evaluates_before_and_after_on_the_same_episodes() -> None:
    """Both evaluations draw the same numbers and sampling seeds, so before and after RL compare
    like with like (they used two batches of seeds)."""
    example = load_example("delegation/train.py")
    _, tokenizer = build_tiny_model(seed=0, spec=TinyModelSpec(hidden_size=32))
    client = PolicyClient(example.scripted_expert(0.3), tokenizer)
    cfg = config(example, "DelegationConfig", eval_episodes=16)
    before = asyncio.run(example.evaluate(client, cfg))
    after = asyncio.run(example.evaluate(client, cfg))
    assert before == after
    assert 0.0 < before["boss_reward"] < 1.0  # the expert's wrong answers: a real spread

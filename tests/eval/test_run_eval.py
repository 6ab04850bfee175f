"""run_eval on a scripted quiz: metrics equal hand-computed pass@k, mean@k and rates; records
round-trip through JSONL; the evaluator and the progress bar do not change results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eval_fakes import QuizEnv, quiz_engine, quiz_requests

from ludic.eval import (
    EngineEvaluator,
    Evaluator,
    Mean,
    MeanAtK,
    PassAtK,
    Rates,
    make_eval_requests,
    read_episode_records,
    run_eval,
)
from ludic.rollouts import ComponentSpec, read_rollouts_jsonl
from ludic.types import Rollout

# Three problems, four samples each. success = reward >= 1 ("right" only).
#   A: right right close wrong -> n=4, c=2, rewards 1, 1, .5, 0 (mean .625)
#   B: wrong wrong wrong right -> n=4, c=1, rewards 0, 0, 0, 1 (mean .25)
#   C: close wrong wrong wrong -> n=4, c=0, rewards .5, 0, 0, 0 (mean .125)
PLAN = {
    "A": ["right", "right", "close", "wrong"],
    "B": ["wrong", "wrong", "wrong", "right"],
    "C": ["close", "wrong", "wrong", "wrong"],
}
# pass@1 = mean(2/4, 1/4, 0) = 0.25
# pass@2 = mean(1 - C(2,2)/C(4,2), 1 - C(3,2)/C(4,2), 0) = mean(5/6, 1/2, 0) = 4/9
# pass@4 = mean(1, 1, 0) = 2/3
# mean@4 = mean(.625, .25, .125) = 1/3
EXPECTED = {
    "pass@1": 0.25,
    "pass@2": 4 / 9,
    "pass@4": 2 / 3,
    "mean@4": 1 / 3,
    "reward/mean": 4 / 12,
    "outcome/right": 3 / 12,
    "outcome/close": 2 / 12,
    "outcome/wrong": 7 / 12,
}
REDUCERS = {
    "pass@1": PassAtK(k=1),
    "pass@2": PassAtK(k=2),
    "pass@4": PassAtK(k=4),
    "mean@4": MeanAtK(k=4),
    "reward/mean": Mean(path="total_reward"),
    "outcome": Rates(path="outcome"),
}


def strict_success(rollout: Rollout) -> bool:
    return rollout.total_reward >= 1.0


async def test_metrics_match_hand_computed_pass_at_k_and_mean_at_k() -> None:
    result = await run_eval(
        quiz_engine(concurrency=5), quiz_requests(PLAN), REDUCERS, success_fn=strict_success
    )
    assert set(result.metrics) == set(EXPECTED)
    for key, value in EXPECTED.items():
        assert result.metrics[key] == pytest.approx(value, abs=1e-12), key
    assert [e.success for e in result.episodes].count(True) == 3
    assert {e.group_id for e in result.episodes} == {"A", "B", "C"}


async def test_default_reducers_add_pass_at_1_and_n() -> None:
    result = await run_eval(quiz_engine(), quiz_requests(PLAN), success_fn=strict_success)
    m = result.metrics
    assert m["episodes"] == 12
    assert m["pass@1"] == pytest.approx(0.25) and m["pass@4"] == pytest.approx(2 / 3)
    assert m["mean@4"] == pytest.approx(1 / 3)
    assert m["success_rate"] == pytest.approx(0.25)  # mean@k of success is pass@1
    assert m["failed_rate"] == 0.0 and m["turns/mean"] == 1.0
    assert "pass@2" not in m


async def test_pass_at_k_beyond_samples_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"pass@5: problem 'A' has 4 samples.*samples_per_problem"):
        await run_eval(quiz_engine(), quiz_requests(PLAN), {"p": PassAtK(k=5)})


async def test_records_are_written_and_read_back(tmp_path: Path) -> None:
    result = await run_eval(
        quiz_engine(), quiz_requests(PLAN), REDUCERS, success_fn=strict_success, out_dir=tmp_path
    )
    episodes = read_episode_records(tmp_path / "episodes.jsonl")
    assert episodes == result.episodes
    steps = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert len(steps) == 12  # one turn per episode
    assert sorted(s["action"] for s in steps) == sorted(h for hs in PLAN.values() for h in hs)
    assert all(s["finish_reason"] == "stop" and s["completion_tokens"] > 0 for s in steps)
    rollouts = read_rollouts_jsonl(tmp_path / "rollouts.jsonl")
    assert [r.id for r in rollouts] == [e.rollout_id for e in episodes]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["pass@2"] == pytest.approx(4 / 9)


async def test_failed_episode_counts_as_unsuccessful_error() -> None:
    requests = quiz_requests({"A": ["right", "right"]})
    bad = quiz_requests({"A": ["right"]})[0]
    bad = type(bad)(
        env=ComponentSpec(name="quiz", kwargs={"no_such_arg": 1}),
        protocol=bad.protocol,
        group_id="A",
        request_id="A:bad",
    )
    result = await run_eval(quiz_engine(), [*requests, bad], {"pass@1": PassAtK(k=1)})
    failed = [e for e in result.episodes if e.failed]
    assert len(failed) == 1 and failed[0].outcome == "error" and not failed[0].success
    assert result.metrics["pass@1"] == pytest.approx(2 / 3)


async def test_progress_bar_gives_same_results() -> None:
    plain = await run_eval(quiz_engine(), quiz_requests(PLAN), REDUCERS, success_fn=strict_success)
    shown = await run_eval(
        quiz_engine(concurrency=2),
        quiz_requests(PLAN),
        REDUCERS,
        success_fn=strict_success,
        progress=True,
    )
    assert shown.metrics == plain.metrics
    assert [e.request_id for e in shown.episodes] == [e.request_id for e in plain.episodes]


async def test_engine_evaluator_as_trainer_hook(tmp_path: Path) -> None:
    def requests() -> list:
        return make_eval_requests(
            env=ComponentSpec(name="quiz", kwargs={"hint": "close"}),
            protocol=ComponentSpec(name="single"),
            num_problems=3,
            samples_per_problem=2,
        )

    evaluator = EngineEvaluator(quiz_engine(), requests, out_dir=tmp_path)
    assert isinstance(evaluator, Evaluator)

    class FakeTrainer:
        step = 7

    metrics = await evaluator(FakeTrainer())
    assert metrics["reward/mean"] == pytest.approx(0.5)
    assert metrics["pass@2"] == pytest.approx(1.0)  # reward 0.5 > 0 counts by default
    assert metrics["outcome/close"] == pytest.approx(1.0)
    assert (tmp_path / "step-000007" / "episodes.jsonl").exists()
    result = evaluator.last_result
    assert result is not None
    assert [e.env_seed for e in result.episodes] == [0, 0, 1, 1, 2, 2]
    sampling_seeds = {e.meta["sampling_seed"] for e in result.episodes}
    assert len(sampling_seeds) == 6


def test_make_eval_requests_groups_problems() -> None:
    reqs = make_eval_requests(
        env=ComponentSpec(name="quiz"),
        protocol=ComponentSpec(name="single"),
        num_problems=2,
        samples_per_problem=3,
        seed=10,
    )
    assert [r.env_seed for r in reqs] == [10, 10, 10, 11, 11, 11]
    assert [r.group_id for r in reqs] == ["problem-0"] * 3 + ["problem-1"] * 3
    assert all(r.meta["eval"] for r in reqs)
    with pytest.raises(ValueError, match="samples_per_problem"):
        make_eval_requests(
            env=ComponentSpec(name="quiz"),
            protocol=ComponentSpec(name="single"),
            num_problems=1,
            samples_per_problem=0,
        )


def test_quiz_env_grades() -> None:
    assert QuizEnv().env_step("close").reward == 0.5

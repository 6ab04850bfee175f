"""OfflineBatchSource drops a stored rollout whose samples cannot be built (here: an agent step
without a token trace) as online batches do: one warning with the count, the first one's file,
id and reason, credit assigned again without it. A file where every rollout fails is refused."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from ludic.agents import Agent
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest, SeedSequencer
from ludic.rollouts.samples import TurnKey
from ludic.training import ConstantCredit, OfflineBatchSource
from ludic.types import Info, Rollout, StepOutcome


class OneStepEnv(SingleAgentEnv):
    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return f"problem {seed}", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="done", reward=1.0, terminated=True)


class SpyCredit:
    """ConstantCredit that records which rollouts each `assign` call counted (not failed)."""

    def __init__(self) -> None:
        self.counted: list[list[str]] = []

    def assign(self, rollouts: Sequence[Rollout]) -> Mapping[TurnKey, float]:
        self.counted.append([r.id for r in rollouts if not r.failed])
        return ConstantCredit().assign(rollouts)


def _write_rollouts(path: Path, n: int, untraced: Sequence[int]) -> list[str]:
    """Write `n` one-turn rollouts to `path`, those at `untraced` with their token trace
    removed (as a backend that returns no token ids records them); returns the ids in order."""
    engine = RolloutEngine(
        env_registry={"one": OneStepEnv},
        protocol_registry={
            "single": lambda: SingleAgentProtocol(Agent(ScriptedClient(["ok"])), max_steps=1)
        },
        jsonl_log=path,
    )
    request = RolloutRequest(env=ComponentSpec(name="one"), protocol=ComponentSpec(name="single"))
    asyncio.run(engine.run(SeedSequencer(run_seed=0).seed_requests([request] * n, 0)))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for i in untraced:
        records[i]["steps"][0]["trace"] = None
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return [r["id"] for r in records]


def test_an_untraced_rollout_is_dropped_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "rollouts.jsonl"
    ids = _write_rollouts(data, 4, untraced=[1, 2])
    credit = SpyCredit()
    with caplog.at_level(logging.WARNING, logger="ludic.training.batching.offline"):
        source = OfflineBatchSource(paths=data, credit_assigner=credit, batch_size=2)
    assert source.num_build_failed == 2
    assert sorted(s.meta["rollout_id"] for s in source.samples) == sorted([ids[0], ids[3]])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "2 of 4 rollouts could not be built into samples and are left out" in warnings[0]
    assert f"the first: rollout {ids[1]} of {data} (ValueError: " in warnings[0]
    assert "has no token trace" in warnings[0]
    # the credit was assigned again without the dropped rollouts
    assert credit.counted[-1] == [ids[0], ids[3]]


def test_a_file_whose_every_rollout_fails_to_build_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "rollouts.jsonl"
    ids = _write_rollouts(data, 2, untraced=[0, 1])
    with pytest.raises(ValueError) as refused:
        OfflineBatchSource(paths=data, credit_assigner=ConstantCredit(), batch_size=2)
    message = str(refused.value)
    assert "no samples from" in message
    assert f"2 could not be built (the first: rollout {ids[0]} of {data}" in message
    assert "has no token trace" in message


def test_a_clean_file_warns_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "rollouts.jsonl"
    _write_rollouts(data, 3, untraced=[])
    with caplog.at_level(logging.WARNING, logger="ludic.training.batching.offline"):
        source = OfflineBatchSource(paths=data, credit_assigner=ConstantCredit(), batch_size=2)
    assert source.num_build_failed == 0 and len(source.samples) == 3
    assert caplog.records == []


def test_bad_settings_are_refused_as_such_not_as_unbuildable_rollouts(tmp_path: Path) -> None:
    data = tmp_path / "rollouts.jsonl"
    _write_rollouts(data, 2, untraced=[])
    with pytest.raises(ValueError, match=r"^sample mode must be one of"):
        OfflineBatchSource(
            paths=data,
            credit_assigner=ConstantCredit(),
            batch_size=2,
            sample_mode="bogus",  # type: ignore[arg-type]
        )

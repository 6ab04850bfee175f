"""OfflineBatchSource's checkpoint state: a restored source serves exactly the batches the
original would have served next (across epochs), and a state saved over other samples, or
with another shuffle seed, is refused instead of training other samples."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from ludic.agents import Agent
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest, SeedSequencer
from ludic.training import BatchSourceExhausted, ConstantCredit, OfflineBatchSource
from ludic.types import Info, StepOutcome


class CountEnv(SingleAgentEnv):
    """One step whose observation names the seed (so every episode's tokens differ)."""

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return f"count {seed}", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="done", reward=1.0, terminated=True)


async def write_rollouts(path: Path, n: int, run_seed: int = 0) -> Path:
    engine = RolloutEngine(
        env_registry={"count": CountEnv},
        protocol_registry={
            "single": lambda: SingleAgentProtocol(Agent(ScriptedClient(["ok"])), max_steps=1)
        },
        jsonl_log=path,
    )
    requests = [
        RolloutRequest(env=ComponentSpec(name="count"), protocol=ComponentSpec(name="single"))
        for _ in range(n)
    ]
    await engine.run(SeedSequencer(run_seed=run_seed).seed_requests(requests, 0))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return asyncio.run(write_rollouts(tmp_path_factory.mktemp("data") / "rollouts.jsonl", 7))


def source(path: Path, **kw: object) -> OfflineBatchSource:
    options: dict[str, object] = {"batch_size": 3, "seed": 5, **kw}
    return OfflineBatchSource(paths=path, credit_assigner=ConstantCredit(), **options)  # type: ignore[arg-type]


def ids(batches: list[object]) -> list[tuple[int, ...]]:
    return [s.input_ids for b in batches for s in b.items]  # type: ignore[attr-defined]


async def test_a_restored_source_serves_the_same_batches_across_epochs(data: Path) -> None:
    whole = source(data)
    served = [await whole.next_batch() for _ in range(8)]  # 3 epochs of 3 batches, nearly
    for cut in range(8):
        first = source(data)
        for _ in range(cut):
            await first.next_batch()
        state = json.loads(json.dumps(first.state_dict()))  # as state.json gives it back
        resumed = source(data)
        resumed.load_state_dict(state)
        rest = [await resumed.next_batch() for _ in range(8 - cut)]
        assert ids(rest) == ids(served[cut:]), cut
        assert [b.stats["epoch"] for b in rest] == [b.stats["epoch"] for b in served[cut:]]


async def test_epochs_run_out_the_same_after_a_restore(data: Path) -> None:
    first = source(data, num_epochs=1)
    for _ in range(3):
        await first.next_batch()
    assert first.exhausted()
    resumed = source(data, num_epochs=1)
    resumed.load_state_dict(first.state_dict())
    assert resumed.exhausted()
    with pytest.raises(BatchSourceExhausted):
        await resumed.next_batch()
    longer = source(data, num_epochs=2)  # more epochs: the run goes on into epoch 1
    longer.load_state_dict(first.state_dict())
    assert not longer.exhausted()
    assert (await longer.next_batch()).stats["epoch"] == 1.0


async def test_a_state_over_other_data_or_seed_is_refused(data: Path, tmp_path: Path) -> None:
    first = source(data)
    await first.next_batch()
    state = first.state_dict()
    fewer = await write_rollouts(tmp_path / "fewer.jsonl", 6)
    with pytest.raises(ValueError, match=r"it has 7 samples, this source 6.*same data file"):
        source(fewer).load_state_dict(state)
    other = await write_rollouts(tmp_path / "other.jsonl", 7, run_seed=1)  # other seeds
    with pytest.raises(ValueError, match="tokens differ"):
        source(other).load_state_dict(state)
    with pytest.raises(ValueError, match="shuffled with seed 5, this source with 6"):
        source(data, seed=6).load_state_dict(state)
    with pytest.raises(ValueError, match="shuffled with seed 5, this source with None"):
        source(data, shuffle=False).load_state_dict(state)
    # A state from before these were recorded loads unchecked.
    old = source(fewer)
    old.load_state_dict({"epoch": 1, "position": 2})
    assert (old.epoch, old.position) == (1, 2)

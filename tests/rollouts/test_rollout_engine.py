"""RolloutEngine: concurrent episodes, meta stamping, failures recorded not raised, JSONL log."""

from __future__ import annotations

from typing import Any

import pytest
from rollout_fakes import CountEnv, LoopProtocol

from ludic.inference.client import ChatRequest, ChatResponse
from ludic.inference.scripted import ScriptedClient
from ludic.rollouts import (
    ComponentSpec,
    RolloutEngine,
    RolloutRequest,
    generate_batch,
    read_rollouts_jsonl,
)
from ludic.types import Info, Rollout


class UnitCredit:
    def assign(self, rollouts: list[Rollout]) -> dict[tuple[str, str], float]:
        return {(r.id, t.turn_id): 1.0 for r in rollouts for t in r.turns()}


class Harness:
    """Registries whose envs report closes and concurrency into shared lists."""

    def __init__(self) -> None:
        self.closed: list[str] = []
        self.live = [0, 0]  # in flight now, most ever in flight
        self.built = 0

    def make_env(self, **kwargs: Any) -> CountEnv:
        env = CountEnv(closed=self.closed, live=self.live, **kwargs)
        self.built += 1
        return env

    def engine(self, **kwargs: Any) -> RolloutEngine:
        return RolloutEngine(
            env_registry={"count": self.make_env},
            protocol_registry={"loop": lambda **kw: LoopProtocol(ScriptedClient(["ok"]), **kw)},
            **kwargs,
        )


def req(i: int, **env_kwargs: Any) -> RolloutRequest:
    return RolloutRequest(
        env=ComponentSpec(name="count", kwargs={"length": 3, **env_kwargs}),
        protocol=ComponentSpec(name="loop", kwargs={"max_steps": 5}),
        env_seed=i,
        sampling_seed=1000 + i,
        group_id=f"g{i // 2}",
        request_id=f"r{i}",
        meta={"difficulty": i, "request_id": "must be overwritten"},
    )


async def test_runs_every_request_and_stamps_meta_in_request_order() -> None:
    h = Harness()
    rollouts = await h.engine(concurrency=3).run([req(i) for i in range(6)])
    assert [r.meta["request_id"] for r in rollouts] == [f"r{i}" for i in range(6)]
    for i, r in enumerate(rollouts):
        assert not r.failed
        assert r.meta["group_id"] == f"g{i // 2}" and r.group_id == f"g{i // 2}"
        assert (r.meta["env_seed"], r.meta["sampling_seed"]) == (i, 1000 + i)
        assert r.meta["difficulty"] == i  # request meta carried
        assert r.meta["sampling_seed_seen"] == 1000 + i  # the protocol got the sampling seed
        assert (r.meta["env_name"], r.meta["protocol_name"]) == ("count", "loop")
        assert r.total_reward == 3.0 and len(r.agent_steps) == 3
        assert r.env_steps[0].prev_obs == f"start seed={i}"
    assert sorted(h.closed) == sorted(str(i) for i in range(6))


async def test_failed_and_timed_out_episodes_never_abort_the_batch() -> None:
    h = Harness()
    requests = [
        req(0),
        req(1, fail_at=1),  # env raises mid-episode
        req(2, hang_at=0),  # never finishes: timed out
        req(3, bogus=True),  # the env factory rejects its kwargs
        req(4, fail_at=0, fail_with=TimeoutError),  # the env's own TimeoutError is not ours
        req(5),
    ]
    rollouts = await h.engine(episode_timeout_s=0.2).run(requests)
    assert [r.meta["request_id"] for r in rollouts] == [f"r{i}" for i in range(6)]
    ok = [r for r in rollouts if not r.failed]
    assert [r.meta["request_id"] for r in ok] == ["r0", "r5"]
    by_id = {r.meta["request_id"]: r for r in rollouts}
    assert by_id["r1"].meta["error_type"] == "RuntimeError"
    assert by_id["r1"].meta["error"] == "env exploded at step 1"
    assert by_id["r1"].meta["error_phase"] == "run"
    assert by_id["r2"].meta["error_type"] == "TimeoutError"
    assert by_id["r2"].meta["error_phase"] == "timeout"
    assert by_id["r3"].meta["error_type"] == "TypeError"
    assert by_id["r3"].meta["error_phase"] == "env_factory"
    assert by_id["r4"].meta["error_phase"] == "run"
    for rid in ("r1", "r2", "r3", "r4"):
        failed, i = by_id[rid], int(rid[1:])
        assert failed.steps == [] and failed.meta["group_id"] == f"g{i // 2}"
        assert failed.meta["env_seed"] == i and failed.meta["difficulty"] == i
    # Every env that was built was closed, failed episodes included.
    assert h.built == 5 and len(h.closed) == 5


async def test_concurrency_limit_holds() -> None:
    h = Harness()
    await h.engine(concurrency=2).run([req(i) for i in range(8)])
    assert h.live[1] == 2
    h1 = Harness()
    await h1.engine(concurrency=1).run([req(i) for i in range(4)])
    assert h1.live[1] == 1


async def test_unknown_names_are_refused_before_anything_runs() -> None:
    h = Harness()
    bad = RolloutRequest(env=ComponentSpec(name="nope"), protocol=ComponentSpec(name="loop"))
    with pytest.raises(KeyError, match=r"'nope'.*registered envs: \['count'\]"):
        await h.engine().run([req(0), bad])
    assert h.built == 0


def test_bad_engine_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        Harness().engine(concurrency=0)
    with pytest.raises(ValueError, match="episode_timeout_s"):
        Harness().engine(episode_timeout_s=0)


async def test_jsonl_log_round_trips_every_rollout(tmp_path) -> None:
    log = tmp_path / "logs" / "rollouts.jsonl"
    engine = Harness().engine(jsonl_log=log, progress=True)
    rollouts = await engine.run([req(0), req(1, fail_at=0), req(2)])
    rollouts += await engine.run([req(3)])  # appends
    logged = read_rollouts_jsonl(log)
    assert sorted((r.to_dict() for r in logged), key=lambda d: d["meta"]["request_id"]) == [
        r.to_dict() for r in rollouts
    ]
    assert any(r.failed for r in logged)


class SilentProtocol:
    async def run(self, env, *, env_seed=None, sampling=None):
        return []


async def test_a_protocol_returning_nothing_is_a_failed_episode() -> None:
    h = Harness()
    engine = RolloutEngine(
        env_registry={"count": h.make_env},
        protocol_registry={"loop": lambda **kw: SilentProtocol()},
    )
    (rollout,) = await engine.run([req(0)])
    assert rollout.failed and "returned no rollouts" in rollout.meta["error"]
    assert h.closed == ["None"]  # closed although the protocol never reset it


class SurrogateClient:
    """Replies with a lone surrogate (valid in a Python str, not encodable as UTF-8)."""

    async def complete(self, request: ChatRequest) -> ChatResponse:
        return ChatResponse(
            text="ok \ud800",
            prompt_token_ids=(1, 2),
            completion_token_ids=(3,),
            finish_reason="stop",
        )


class SurrogateEnv(CountEnv):
    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        super().env_reset(seed)
        return "start \udfff", {}


async def test_a_lone_surrogate_in_a_reply_or_env_text_loses_nothing(tmp_path) -> None:
    log = tmp_path / "rollouts.jsonl"
    engine = RolloutEngine(
        env_registry={"count": SurrogateEnv},
        protocol_registry={"loop": lambda **kw: LoopProtocol(SurrogateClient(), **kw)},
        jsonl_log=log,
    )
    result = await generate_batch(engine, [req(i) for i in range(3)], UnitCredit())
    assert result.stats.num_failed == 0 and result.stats.num_log_failures == 0
    assert len(result.samples) == 9
    logged = read_rollouts_jsonl(log)
    assert len(logged) == 3 and all("log_error" not in r.meta for r in result.rollouts)
    assert {r.steps[0].completion for r in logged} == {"ok \ud800"}
    assert {r.env_steps[0].prev_obs for r in logged} == {"start \udfff"}


async def test_a_log_failure_is_recorded_and_counted_never_raised(tmp_path, caplog) -> None:
    log = tmp_path / "is_a_directory"
    log.mkdir()
    result = await generate_batch(Harness().engine(jsonl_log=log), [req(0), req(1)], UnitCredit())
    assert result.stats.num_failed == 0 and len(result.samples) == 6  # the batch trains
    assert result.stats.num_log_failures == 2
    assert all("IsADirectoryError" in r.meta["log_error"] for r in result.rollouts)
    assert "could not write rollout" in caplog.text


async def test_one_unserialisable_rollout_does_not_stop_the_others_being_logged(
    tmp_path,
) -> None:
    log = tmp_path / "rollouts.jsonl"
    bad = req(1)
    bad.meta["handle"] = object()  # request meta lands in rollout meta
    rollouts = await Harness().engine(jsonl_log=log).run([req(0), bad, req(2)])
    assert sorted(r.meta["request_id"] for r in read_rollouts_jsonl(log)) == ["r0", "r2"]
    assert "not JSON-serialisable" in rollouts[1].meta["log_error"]
    assert not rollouts[1].failed

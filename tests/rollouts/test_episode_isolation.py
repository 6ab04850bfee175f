"""One bad episode never stops a batch: a blocking sync env step, a slow parser, a hung
`env.close()`, a stray CancelledError and a rollout whose samples cannot be built each become
one failed rollout with its reason, while the rest of the batch completes (issue 19 section 5,
issue 27 section 2). The real SingleAgentProtocol + Agent run every episode here.

No timing asserts: "the batch did not wait for the bad episode" is checked by ordering (the
blocking call is still blocked when `engine.run` returns), never by elapsed seconds.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from ludic._aio import abandoned_worker_calls, maybe_await
from ludic.agents import Agent, ToolAgent
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference.client import ChatRequest, ChatResponse
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest, generate_batch
from ludic.types import Info, ParseResult, Rollout, StepOutcome


class Gate:
    """A threading.Event the test opens at teardown, so a blocked worker thread ends."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.passed = threading.Event()  # set once the blocked call has returned

    def block(self, limit_s: float = 30.0) -> None:
        self.open.wait(limit_s)
        self.passed.set()


@pytest.fixture
def gate():
    g = Gate()
    yield g
    g.open.set()


class TwoStepEnv(SingleAgentEnv):
    """Synchronous env: reward 1 per "ok", terminates after two steps. `block_step` makes
    its first step block on `gate` (a sync call that never yields to the event loop);
    `close_mode` makes `close` hang ("async" / "sync") or raise ("raise")."""

    close_timeout_s = 0.2

    def __init__(
        self,
        *,
        gate: Gate | None = None,
        block_step: bool = False,
        close_mode: str | None = None,
        closes: list[str] | None = None,
    ) -> None:
        self.gate = gate
        self.block_step = block_step
        self.close_mode = close_mode
        self.closes = closes if closes is not None else []
        self.t = 0

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self.t = 0
        return f"task {seed}", {}

    def env_step(self, action: str) -> StepOutcome:
        if self.block_step and self.gate is not None:
            self.gate.block()
        self.t += 1
        return StepOutcome(
            obs=f"obs {self.t}", reward=float(action == "ok"), terminated=self.t >= 2
        )

    def close(self) -> Any:
        self.closes.append(self.close_mode or "ok")
        if self.close_mode == "async":
            return asyncio.sleep(3600)  # an awaitable that never finishes
        if self.close_mode == "sync" and self.gate is not None:
            self.gate.block()
        if self.close_mode == "raise":
            raise OSError("socket already gone")
        return None


def make_engine(protocol_factory=None, **engine_kwargs: Any) -> RolloutEngine:
    def protocol(**kwargs: Any) -> SingleAgentProtocol:
        return SingleAgentProtocol(Agent(ScriptedClient(["ok"])), max_steps=4, **kwargs)

    return RolloutEngine(
        env_registry={"two": TwoStepEnv},
        protocol_registry={"single": protocol_factory or protocol},
        **engine_kwargs,
    )


def req(i: int, protocol: dict[str, Any] | None = None, **env_kwargs: Any) -> RolloutRequest:
    return RolloutRequest(
        env=ComponentSpec(name="two", kwargs=env_kwargs),
        protocol=ComponentSpec(name="single", kwargs=protocol or {}),
        env_seed=i,
        request_id=f"r{i}",
        group_id="g",
    )


def by_request(rollouts: Sequence[Rollout]) -> dict[str, Rollout]:
    return {r.meta["request_id"]: r for r in rollouts}


def assert_ok(rollout: Rollout) -> None:
    assert not rollout.failed, rollout.meta.get("error")
    assert rollout.total_reward == 2.0 and len(rollout.agent_steps) == 2


async def test_a_blocking_sync_env_step_times_out_while_the_others_finish(
    gate: Gate, caplog: pytest.LogCaptureFixture
) -> None:
    engine = make_engine(episode_timeout_s=0.5, concurrency=4)
    requests = [req(0), req(1, gate=gate, block_step=True), req(2), req(3)]
    rollouts = by_request(await engine.run(requests))
    # The batch came back while the step was still blocked: it was neither waited for nor
    # allowed to stall the event loop (before, it ran on the loop and "succeeded" after 30 s).
    assert not gate.passed.is_set()
    assert abandoned_worker_calls() >= 1  # the step still runs on its thread, and says so
    assert "TwoStepEnv.step was abandoned" in caplog.text
    bad = rollouts["r1"]
    assert bad.failed and bad.meta["error_phase"] == "timeout"
    assert bad.meta["error"] == "episode exceeded episode_timeout_s=0.5"
    for rid in ("r0", "r2", "r3"):
        assert_ok(rollouts[rid])


async def test_a_blocking_sync_tool_times_out_while_the_others_finish(gate: Gate) -> None:
    def lookup() -> str:
        """A sync tool that blocks (a network call that never answers)."""
        gate.block()
        return "late"

    def protocol(slow: bool = False) -> SingleAgentProtocol:
        call = '<tool_call>{"name": "lookup", "arguments": {}}</tool_call>'
        agent = ToolAgent(ScriptedClient([call, "ok", "ok"] if slow else ["ok"]), tools=[lookup])
        return SingleAgentProtocol(agent, max_steps=4)

    engine = make_engine(protocol, episode_timeout_s=0.5)
    rollouts = by_request(await engine.run([req(0), req(1, protocol={"slow": True}), req(2)]))
    assert not gate.passed.is_set()  # the tool still blocks; it held neither the loop nor the batch
    assert rollouts["r1"].meta["error_phase"] == "timeout"
    assert_ok(rollouts["r0"])
    assert_ok(rollouts["r2"])


def spin_parser(gate: Gate):
    """Pure-Python busy loop on text starting with "SLOW" (a pathological parser that never
    releases the GIL voluntarily), else the identity."""

    def parse(text: str) -> ParseResult:
        if text.startswith("SLOW"):
            deadline = time.monotonic() + 30.0
            n = 0
            while not gate.open.is_set() and time.monotonic() < deadline:
                n += 1
            gate.passed.set()
        return ParseResult(action=text)

    return parse


async def test_a_slow_parser_is_bounded_by_the_episode_timeout(gate: Gate) -> None:
    slow_reply = "SLOW" + "x" * 5000  # long: parsed on a worker thread

    def protocol(slow: bool = False) -> SingleAgentProtocol:
        client = ScriptedClient([slow_reply if slow else "ok"])
        return SingleAgentProtocol(Agent(client, parser=spin_parser(gate)), max_steps=4)

    engine = make_engine(protocol, episode_timeout_s=0.5)
    requests = [req(0), req(1, protocol={"slow": True}), req(2)]
    rollouts = by_request(await engine.run(requests))
    assert not gate.passed.is_set()  # the parser still spins; nobody waited for it
    assert rollouts["r1"].meta["error_phase"] == "timeout"
    assert_ok(rollouts["r0"])
    assert_ok(rollouts["r2"])


@pytest.mark.parametrize("mode", ["async", "sync", "raise"])
async def test_a_hung_or_failing_env_close_fails_only_its_episode(gate: Gate, mode: str) -> None:
    closes: list[str] = []
    engine = make_engine()  # no episode timeout: only close_timeout_s bounds the close
    requests = [req(0, closes=closes), req(1, gate=gate, close_mode=mode, closes=closes)]
    rollouts = by_request(await engine.run(requests))
    assert_ok(rollouts["r0"])
    bad = rollouts["r1"]
    assert bad.failed and bad.meta["error_type"] == "EnvCloseError"
    assert bad.meta["error_phase"] == "close"
    expected = "raised OSError: socket already gone" if mode == "raise" else "close_timeout_s=0.2"
    assert "TwoStepEnv.close()" in bad.meta["error"] and expected in bad.meta["error"]
    # The protocol closed (and awaited) each env once; the engine did not wait on it again.
    assert sorted(closes) == sorted(["ok", mode])


class NonClosingProtocol:
    """A protocol that leaves closing to the engine."""

    async def run(self, env, *, env_seed=None, sampling=None) -> list[Rollout]:
        await maybe_await(env.reset(seed=env_seed))
        return [Rollout(meta={"ran": True})]


async def test_the_engine_bounds_a_hung_close_the_protocol_left_to_it(gate: Gate) -> None:
    engine = make_engine(lambda: NonClosingProtocol())
    rollouts = by_request(await engine.run([req(0), req(1, close_mode="async")]))
    assert not rollouts["r0"].failed and rollouts["r0"].meta["ran"]
    assert rollouts["r1"].meta["error_phase"] == "close"
    assert "close_timeout_s=0.2" in rollouts["r1"].meta["env_close_error"]


class CancellingClient:
    """A client whose call raises CancelledError (e.g. an inner task it awaited was cancelled)
    although nobody cancelled the batch."""

    async def complete(self, request: ChatRequest) -> ChatResponse:
        inner = asyncio.ensure_future(asyncio.sleep(3600))
        inner.cancel()
        return await inner  # type: ignore[return-value]


async def test_a_stray_cancelled_error_fails_only_its_episode() -> None:
    def protocol(cancel: bool = False) -> SingleAgentProtocol:
        client = CancellingClient() if cancel else ScriptedClient(["ok"])
        return SingleAgentProtocol(Agent(client), max_steps=4)

    closes: list[str] = []
    engine = make_engine(protocol)
    requests = [req(0, closes=closes), req(1, protocol={"cancel": True}, closes=closes), req(2)]
    rollouts = by_request(await engine.run(requests))
    assert_ok(rollouts["r0"])
    assert_ok(rollouts["r2"])
    bad = rollouts["r1"]
    assert bad.meta["error_type"] == "CancelledError" and bad.meta["error_phase"] == "run"
    assert "although the batch was not cancelled" in bad.meta["error"]
    assert len(closes) == 2  # the cancelled episode's env was closed too


async def test_cancelling_the_batch_itself_still_cancels_it(gate: Gate) -> None:
    closes: list[str] = []
    engine = make_engine()
    requests = [req(0, closes=closes), req(1, gate=gate, block_step=True, closes=closes)]
    task = asyncio.create_task(engine.run(requests))
    while len(closes) < 1:  # the first episode finished; the second is blocked in its step
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(closes) == 2  # the cancelled episode's env was closed on the way out


class NoIdsClient:
    """A backend that returns text but no token ids: its steps carry no token trace."""

    async def complete(self, request: ChatRequest) -> ChatResponse:
        return ChatResponse(text="ok", finish_reason="stop")


class RecordingCredit:
    """Weight 1 per turn; records which rollouts each call saw."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.failed: list[list[str]] = []

    def assign(self, rollouts: Sequence[Rollout]) -> dict[tuple[str, str], float]:
        self.calls.append([r.meta["request_id"] for r in rollouts])
        self.failed.append([r.meta["request_id"] for r in rollouts if r.failed])
        return {(r.id, t.turn_id): 1.0 for r in rollouts for t in r.turns()}


async def test_a_rollout_whose_samples_cannot_be_built_fails_alone() -> None:
    def protocol(no_ids: bool = False) -> SingleAgentProtocol:
        client = NoIdsClient() if no_ids else ScriptedClient(["ok"])
        return SingleAgentProtocol(Agent(client), max_steps=4)

    credit = RecordingCredit()
    requests = [req(0), req(1, protocol={"no_ids": True}), req(2)]
    result = await generate_batch(make_engine(protocol), requests, credit)
    rollouts = by_request(result.rollouts)
    bad = rollouts["r1"]
    assert bad.failed and bad.meta["error_phase"] == "build_samples"
    assert bad.meta["error_type"] == "ValueError" and "trace" in bad.meta["error"]
    assert len(bad.agent_steps) == 2  # kept for inspection
    # Credit was assigned again with it marked failed (every assigner leaves failed rollouts
    # out of group baselines; HierarchicalCredit keeps a failed parent's children); the rest
    # trained.
    assert credit.calls == [["r0", "r1", "r2"], ["r0", "r1", "r2"]]
    assert credit.failed == [[], ["r1"]]
    assert {s.meta["request_id"] for s in result.samples} == {"r0", "r2"}
    assert len(result.samples) == 4
    stats = result.stats
    assert (stats.num_failed, stats.num_build_failed, stats.num_samples) == (1, 1, 4)
    assert stats.mean_reward == 2.0


async def test_bad_sample_settings_still_raise() -> None:
    with pytest.raises(ValueError, match="sample mode"):
        await generate_batch(make_engine(), [req(0)], RecordingCredit(), sample_mode="bogus")  # type: ignore[arg-type]

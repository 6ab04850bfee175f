"""README walk (walkG), "Running model-written code safely": the block's pool given to a
`CodeTestEnv`, episodes run batch after batch, each batch under its own `asyncio.run`.

Found: the second batch's tests that waited for one of the pool's 4 slots failed with
"Semaphore ... is bound to a different event loop", so its episodes failed; and a sandbox
killed from outside mid-batch (the host's OOM killer, an operator) was cached as the program's
own crash, so the same program in a later episode got it again without running. Now every
batch runs, a killed sandbox fails only its own test, recorded with its signal, and the next
identical run runs again."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from ludic.agents import Agent
from ludic.envs import CodeTestEnv
from ludic.inference import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest
from ludic.sandbox import SandboxLimits, SandboxPool, detect_backend
from ludic.types import Rollout

SUM_TWO = "a, b = map(int, input().split())\nprint(a + b)\n"  # the bundled problem 0


@pytest.fixture
def pool() -> SandboxPool:
    backend = asyncio.run(detect_backend())
    if backend.isolation != "bubblewrap":
        pytest.skip("needs bubblewrap (the README's sandbox), which cannot run here")
    # as the README builds it
    return SandboxPool(
        limits=SandboxLimits(wall_time_s=5, memory_bytes=256 * 2**20), max_concurrency=4
    )


def _batch(pool: SandboxPool, programs: list[str]) -> list[Rollout]:
    """One episode of problem 0 per program, under a fresh `asyncio.run`."""
    replies = iter(programs)

    def single() -> SingleAgentProtocol:
        reply = f"```python\n{next(replies)}```"
        return SingleAgentProtocol(Agent(ScriptedClient([reply])), max_steps=1)

    engine = RolloutEngine(
        env_registry={"code": lambda: CodeTestEnv(pool=pool)},
        protocol_registry={"single": single},
        concurrency=len(programs),
        episode_timeout_s=120,
    )
    env, protocol = ComponentSpec(name="code"), ComponentSpec(name="single")
    requests = [RolloutRequest(env=env, protocol=protocol, env_seed=0) for _ in programs]
    return asyncio.run(engine.run(requests))


def _tests(rollout: Rollout) -> list[dict]:
    assert "error" not in rollout.meta, rollout.meta
    return rollout.steps[-1].info["tests"]


def test_the_readme_pool_runs_batch_after_batch(pool: SandboxPool) -> None:
    for batch in range(3):  # 2 episodes x 4 tests: 4 runs wait for a slot in every batch
        programs = [f"# batch {batch}, episode {i}\n{SUM_TWO}" for i in range(2)]
        rollouts = _batch(pool, programs)
        assert [r.total_reward for r in rollouts] == [1.0, 1.0], [r.meta for r in rollouts]


def _kill_program_holding(marker: str) -> bool:
    """SIGKILL, from outside, one sandboxed program whose source holds `marker`."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if argv[-2:] != [b"main.py", b""] or marker not in (entry / "cwd/main.py").read_text():
                continue
        except (OSError, ValueError):
            continue
        os.kill(int(entry.name), signal.SIGKILL)
        return True
    return False


@pytest.mark.skipif(os.geteuid() != 0, reason="killing a sandboxed program from outside needs root")
def test_a_sandbox_killed_mid_batch_fails_only_its_test(pool: SandboxPool) -> None:
    marker = f"kill-me-{os.getpid()}"
    slow = f"import time  # {marker}\ntime.sleep(2)\n{SUM_TWO}"
    programs = [slow, f"# other\n{SUM_TWO}", f"# third\n{SUM_TWO}"]
    killed = threading.Event()

    def kill_when_running() -> None:
        for _ in range(1000):
            if _kill_program_holding(marker):
                killed.set()
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_when_running)
    killer.start()
    rollouts = _batch(pool, programs)
    killer.join()
    assert killed.is_set()
    crashed = [t for t in _tests(rollouts[0]) if not t["passed"]]
    assert [(t["killed_signal"], t["exit_code"], t["limit_hit"]) for t in crashed] == [
        (signal.SIGKILL, None, None)
    ]
    assert rollouts[0].total_reward == 0.75
    assert [r.total_reward for r in rollouts[1:]] == [1.0, 1.0]
    again = _batch(pool, programs)  # the killed test runs again, not from the cache
    assert [r.total_reward for r in again] == [1.0, 1.0, 1.0]

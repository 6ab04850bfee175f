"""OpenEnvEnv on a real OpenEnv Environment: in process, and behind OpenEnv's own server and
WebSocket client; the CLI's `openenv:...` and a short GRPO run. Skipped without openenv-core."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ludic.agents import Agent
from ludic.envs.adapters.openenv import OpenEnvEnv
from ludic.envs.registry import adapter_spec
from ludic.errors import is_refusal
from ludic.inference import ScriptedClient
from ludic.interaction import SingleAgentProtocol

pytest.importorskip("openenv.core", reason="needs openenv-core: pip install 'ludic[openenv]'")
from openenv.core import Action, Environment, Observation, State

WORDS = ("apple", "pear", "plum")


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    message: str


class GuessWordEnvironment(Environment):  # type: ignore[misc]
    """Guess the word the seed picks; each wrong guess says how many letters it has."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)
        self.word = WORDS[0]

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kw: Any
    ) -> GuessObservation:
        self.word = WORDS[(seed or 0) % len(WORDS)]
        self._state = State(step_count=0)
        return GuessObservation(message="Guess the fruit.", reward=0.0)

    def step(
        self, action: GuessAction, timeout_s: float | None = None, **kw: Any
    ) -> GuessObservation:
        self._state.step_count += 1
        if action.guess == self.word:
            return GuessObservation(
                message="Right!", reward=1.0, done=True, metadata={"tries": self._state.step_count}
            )
        return GuessObservation(message=f"No; it has {len(self.word)} letters.", reward=0.0)

    @property
    def state(self) -> State:
        return self._state


def guesser(messages: list[dict[str, Any]]) -> str:
    """Guesses "pear" first, then the fruit with the length the env gave."""
    text = messages[-1]["content"] or ""
    for word in WORDS:
        if f"has {len(word)} letters" in text:
            return word
    return "pear"


async def test_in_process_environment_plays_with_openenv_rewards() -> None:
    env = OpenEnvEnv(GuessWordEnvironment())
    assert env.action_field == "guess"  # the action's only text field
    (rollout,) = await SingleAgentProtocol(Agent(ScriptedClient(guesser)), max_steps=5).run(
        env, env_seed=0
    )
    steps = rollout.env_steps
    assert [s.action for s in steps] == ["pear", "apple"]
    assert [s.reward for s in steps] == [0.0, 1.0] and steps[-1].terminated
    assert steps[0].prev_obs == "Guess the fruit." and steps[-1].info == {"tries": 2}


def test_ambiguous_actions_and_wrong_envs_are_clear_errors() -> None:
    class TwoFields(Action):
        a: str
        b: str

    with pytest.raises(ValueError, match="2 text fields"):
        OpenEnvEnv(GuessWordEnvironment(), action_type=TwoFields)
    with pytest.raises(TypeError, match="Environment or EnvClient"):
        OpenEnvEnv(object())
    with pytest.raises(ValueError, match="neither a server URL"):
        adapter_spec("openenv:not_an_import")


def test_cli_resolves_an_environment_class() -> None:
    spec = adapter_spec(f"openenv:{__name__}:GuessWordEnvironment")
    assert spec is not None and isinstance(spec(), OpenEnvEnv)


def test_a_missing_environment_module_or_class_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"cannot import module 'no_such_pkg\.server'") as caught:
        adapter_spec("openenv:no_such_pkg.server:MyEnvironment")
    assert is_refusal(caught.value)  # `ludic train` prints one error line, not a traceback
    with pytest.raises(ValueError, match=f"module '{__name__}' has no attribute 'NoSuchEnv'"):
        adapter_spec(f"openenv:{__name__}:NoSuchEnv")


def test_missing_openenv_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openenv.core", None)
    with pytest.raises(ImportError, match=r"pip install 'ludic\[openenv\]'"):
        OpenEnvEnv(GuessWordEnvironment())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def openenv_server() -> Iterator[str]:
    import uvicorn
    from openenv.core.env_server.http_server import create_fastapi_app

    app = create_fastapi_app(GuessWordEnvironment, GuessAction, GuessObservation)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the OpenEnv test server did not start within 20 s")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.mark.slow
async def test_a_running_openenv_server_plays_through_its_client(openenv_server: str) -> None:
    spec = adapter_spec(f"openenv:{openenv_server}")
    assert spec is not None
    assert spec(action_field="guess").close() is None  # never connected: closes synchronously
    rollouts = []
    for seed in (0, 1):  # two sessions, one after the other
        env = spec(action_field="guess")
        agent = Agent(ScriptedClient(guesser))
        rollouts += await asyncio.wait_for(
            SingleAgentProtocol(agent, max_steps=5).run(env, env_seed=seed), 30
        )
    assert [r.env_steps[-1].reward for r in rollouts] == [1.0, 1.0]
    assert [len(r.env_steps) for r in rollouts] == [2, 1]  # seed 1 is "pear", the first guess


@pytest.mark.slow
def test_ludic_train_runs_grpo_on_an_openenv_environment(tmp_path: Path) -> None:
    from ludic.recipes.configs import TrainConfig
    from ludic.recipes.train import train_command

    cfg = TrainConfig(
        env=f"openenv:{__name__}:GuessWordEnvironment",
        steps=2,
        problems_per_step=1,
        group_size=2,
        max_tokens=8,
        max_steps=2,
        out_dir=tmp_path,
        progress=False,
    )
    result = train_command(cfg)
    assert result.steps == 2 and (result.checkpoint / "model" / "config.json").is_file()
    episodes = (tmp_path / "rollouts.jsonl").read_text().splitlines()
    assert len(episodes) == 2 * 1 * 2 and all('"error"' not in e for e in episodes)

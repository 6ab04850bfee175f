"""GymnasiumEnv on real Gymnasium envs: FrozenLake's ANSI board, named discrete actions, the
state key GiGPO groups by, a Text-space env, the CLI's `gymnasium:ID`, and a short GRPO run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from ludic._aio import maybe_await
from ludic.agents import Agent
from ludic.envs.adapters import GymnasiumEnv, ansi_to_text, discrete_action_parser
from ludic.envs.registry import adapter_spec, env_parser, make_env
from ludic.eval.env_spec import resolve_env_factory
from ludic.inference import ScriptedClient
from ludic.interaction import SingleAgentProtocol

gym = pytest.importorskip("gymnasium", reason="needs gymnasium: pip install 'ludic[gymnasium]'")

# FrozenLake 4x4, not slippery: S at 0, goal at 15, holes at 5, 7, 11, 12.
WINNING_PATH = ["Right", "Right", "Down", "Down", "Down", "Right"]


def test_ansi_to_text_keeps_highlighted_cells_visible() -> None:
    assert ansi_to_text("\x1b[41mS\x1b[0mFFF\nFHFH") == "[S]FFF\nFHFH"
    assert ansi_to_text("|\x1b[34;1mB\x1b[0m: |\x1b[2J") == "|[B]: |"
    assert ansi_to_text("plain") == "plain"
    assert ansi_to_text("\x1b[43mopen") == "[open]"  # an unterminated style still shows


async def test_frozenlake_plays_to_the_goal_with_named_actions() -> None:
    env = make_env("gymnasium:FrozenLake-v1", is_slippery=False)
    parser = env_parser("gymnasium:FrozenLake-v1")
    assert parser is not None
    client = ScriptedClient([f"<action>{a}</action>" for a in WINNING_PATH])
    agent = Agent(client, parser=parser)
    (rollout,) = await SingleAgentProtocol(agent, max_steps=20).run(env, env_seed=0)
    steps = rollout.env_steps
    assert [s.reward for s in steps] == [0.0] * 5 + [1.0]
    assert steps[-1].terminated and not steps[-1].truncated
    first_prompt = client.requests[0].messages[-1]["content"]
    assert "[S]FFF" in first_prompt and "\x1b" not in first_prompt
    assert "Legal actions: Left, Down, Right, Up" in first_prompt
    assert "The episode is over." in steps[-1].next_obs
    # the state key is FrozenLake's own state index, recorded for GiGPO
    keys = [s.state_key for s in steps]
    assert keys == ["1", "2", "6", "10", "14", "15"]  # the state each step led to


async def test_falling_in_a_hole_ends_with_gymnasium_reward() -> None:
    env = GymnasiumEnv("FrozenLake-v1", is_slippery=False)
    agent = Agent(
        ScriptedClient(["<action>Down</action>", "<action>right</action>"]), parser=env.parser
    )
    (rollout,) = await SingleAgentProtocol(agent, max_steps=20).run(env, env_seed=0)
    assert [s.reward for s in rollout.env_steps] == [0.0, 0.0]  # 0 -> 4 -> 5 (a hole)
    assert rollout.env_steps[-1].terminated


async def test_time_limit_is_gymnasium_truncation() -> None:
    env = GymnasiumEnv("FrozenLake-v1", is_slippery=False, max_episode_steps=3)
    agent = Agent(ScriptedClient(["<action>Left</action>"]), parser=env.parser)
    (rollout,) = await SingleAgentProtocol(agent, max_steps=20).run(env, env_seed=0)
    assert len(rollout.env_steps) == 3
    assert rollout.env_steps[-1].truncated and not rollout.env_steps[-1].terminated


def test_discrete_parser_maps_names_and_indices_and_rejects_others() -> None:
    parse = discrete_action_parser(("Left", "Down", "Right", "Up"))
    assert parse("<action>up</action>").action == "Up"
    assert parse("<action>2</action>").action == "Right"
    bad = parse("<action>jump</action>")
    assert bad.action is None and bad.reward < 0 and "Left, Down, Right, Up" in (bad.obs or "")
    assert parse("no tag").action is None


async def test_an_illegal_action_reaching_the_env_is_not_sent_to_gymnasium() -> None:
    env = GymnasiumEnv("FrozenLake-v1", is_slippery=False)
    await maybe_await(env.reset(seed=0))
    out = (await maybe_await(env.step({"agent_0": "fly"})))["agent_0"]
    assert out.info["invalid_action"] and out.reward == -1.0 and not out.terminated
    assert env.state_key("agent_0") == 0
    out = (await maybe_await(env.step({"agent_0": "1"})))["agent_0"]  # index 1 is Down
    assert env.state_key("agent_0") == 4 and out.info["gym_action"] == 1


async def test_taxi_uses_its_own_action_names_and_seeded_start() -> None:
    env_a, env_b = GymnasiumEnv("Taxi-v4"), GymnasiumEnv("Taxi-v4")
    assert env_a.action_names == ("South", "North", "East", "West", "Pickup", "Dropoff")
    obs_a = (await maybe_await(env_a.reset(seed=7)))["agent_0"][0]
    obs_b = (await maybe_await(env_b.reset(seed=7)))["agent_0"][0]
    assert obs_a == obs_b and "+---------+" in obs_a and "\x1b" not in obs_a
    assert env_a.state_key("agent_0") == env_b.state_key("agent_0")


class _SpellEnv(gym.Env):  # type: ignore[misc]
    """A Text-space env: say the target word to win."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Text(64)
        self.action_space = gym.spaces.Text(64)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.word = ["apple", "pear"][int(self.np_random.integers(2))]
        return f"say {self.word}", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        ok = action == self.word
        return ("yes" if ok else "no"), float(ok), ok, False, {}


async def test_text_action_space_passes_the_text_through() -> None:
    env = GymnasiumEnv(env=_SpellEnv())
    assert env.action_names is None
    client = ScriptedClient(lambda m: f"<action>{m[-1]['content'].split()[1]}</action>")
    agent = Agent(client, parser=env.parser)
    (rollout,) = await SingleAgentProtocol(agent, max_steps=3).run(env, env_seed=1)
    assert rollout.env_steps[-1].reward == 1.0 and rollout.env_steps[-1].terminated
    assert rollout.env_steps[0].state_key is not None  # the text is the key


def test_continuous_actions_and_unknown_ids_are_refused_clearly() -> None:
    with pytest.raises(ValueError, match="Discrete and Text action spaces"):
        GymnasiumEnv("Pendulum-v1")
    with pytest.raises(ValueError, match="unknown Gymnasium env 'NoSuchEnv-v0'"):
        GymnasiumEnv("NoSuchEnv-v0")


def test_a_misspelt_env_kwarg_names_the_keywords_the_env_takes(tmp_path: Path) -> None:
    """A typo in --env-kwargs (the adapter's factory takes **kwargs, so it passes the up-front
    signature check) was a TypeError traceback from `ludic eval`/`train`; now a refusal
    naming the keyword and what the env takes."""
    from ludic.cli import main as ludic_main

    with pytest.raises(ValueError, match=r"did not take the keywords \['is_slipery'\]") as refused:
        GymnasiumEnv("FrozenLake-v1", is_slipery=False)
    assert "is_slippery" in str(refused.value).split("it takes")[1]
    env_kwargs = ["--env-kwargs", '{"is_slipery": false}']
    with pytest.raises(ValueError, match="is_slipery"):
        ludic_main(
            [
                "eval",
                "--env",
                "gymnasium:FrozenLake-v1",
                *env_kwargs,
                "--no-progress",
                "--out-dir",
                str(tmp_path),
            ]
        )


def test_cli_resolves_gymnasium_ids_and_still_imports_module_factories() -> None:
    factory = resolve_env_factory("gymnasium:FrozenLake-v1")
    assert getattr(factory, "parser", None) is not None
    assert isinstance(factory(map_name="8x8"), GymnasiumEnv)
    assert resolve_env_factory("ludic.envs:GuessNumberEnv") is not None
    assert adapter_spec("tictactoe") is None and adapter_spec("ludic.envs:GuessNumberEnv") is None


def test_missing_gymnasium_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gymnasium", None)
    with pytest.raises(ImportError, match=r"pip install 'ludic\[gymnasium\]'"):
        GymnasiumEnv("FrozenLake-v1")


@pytest.mark.slow
def test_ludic_train_runs_grpo_on_gymnasium_frozenlake(tmp_path: Path) -> None:
    from ludic.recipes.configs import TrainConfig
    from ludic.recipes.train import train_command

    cfg = TrainConfig(
        env="gymnasium:FrozenLake-v1",
        env_kwargs='{"is_slippery": false}',
        context="latest",
        steps=2,
        problems_per_step=1,
        group_size=2,
        max_steps=3,
        max_tokens=8,
        out_dir=tmp_path,
        progress=False,
    )
    result = train_command(cfg)
    assert result.steps == 2 and (result.checkpoint / "model" / "config.json").is_file()
    rollouts = (tmp_path / "rollouts.jsonl").read_text().splitlines()
    assert len(rollouts) == 2 * 1 * 2
    assert "FrozenLake-v1" in rollouts[0]  # the adapter's system prompt reached the model

"""A Gymnasium env's keyword of the wrong type is refused against its constructor's
annotations, as `--env-kwargs` is for Ludic's own envs. The adapter's factory takes **kwargs,
so the up-front check could not see them, and Gymnasium took whatever came:
`--env-kwargs '{"is_slippery": "no"}'` built a slippery FrozenLake ("no" is truthy), the
opposite of what was asked, without a word."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("gymnasium")

from ludic.envs.adapters.gymnasium import GymnasiumEnv


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"is_slippery": "no"},
            r"""Gymnasium env 'FrozenLake-v1' takes 'is_slippery' as true or false, got "no" """
            r"""\(str\); pass true or false for "is_slippery" in --env-kwargs""",
        ),
        (
            {"is_slippery": "false"},
            r"""got "false" \(str\); write it without quotes: --env-kwargs """
            r"""'\{"is_slippery": false\}'""",
        ),
        (
            {"success_rate": "0.5"},
            r"""takes 'success_rate' as float \(or int\), got "0.5" \(str\); write it without """
            r"""quotes: --env-kwargs '\{"success_rate": 0.5\}'""",
        ),
        ({"map_name": 4}, r"takes 'map_name' as str, got 4 \(int\)"),
    ],
)
def test_a_wrong_type_is_refused_naming_the_keyword_and_the_fix(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        GymnasiumEnv("FrozenLake-v1", **kwargs)


def test_right_types_and_gymnasium_make_keywords_pass() -> None:
    env = GymnasiumEnv("FrozenLake-v1", is_slippery=False, success_rate=1, max_episode_steps=5)
    assert len(env.env.unwrapped.P[0][0]) == 1  # one outcome per move: not slippery


def test_ludic_eval_refuses_it_before_any_episode(tmp_path: Path) -> None:
    from ludic.cli import main as ludic_main

    argv = ["eval", "--env", "gymnasium:FrozenLake-v1", "--env-kwargs", '{"is_slippery": "no"}']
    with pytest.raises(ValueError, match="takes 'is_slippery' as true or false"):
        ludic_main([*argv, "--no-progress", "--out-dir", str(tmp_path / "eval")])
    assert not (tmp_path / "eval" / "episodes.jsonl").exists()


def test_the_adapters_own_keywords_are_checked_beside_the_envs() -> None:
    """GymnasiumEnv's own `invalid_action_reward="-1"` was taken, and every illegal move then
    failed its episode as "GymnasiumEnv.env_step returned a StepOutcome whose reward is '-1'"
    (the **kwargs beside it kept `checked_arguments` from reading its named parameters)."""
    from ludic.errors import is_refusal

    with pytest.raises(TypeError, match=r"GymnasiumEnv: invalid_action_reward must be float") as e:
        GymnasiumEnv("FrozenLake-v1", invalid_action_reward="-1")  # type: ignore[arg-type]
    assert "pass invalid_action_reward=-1" in str(e.value) and is_refusal(e.value)

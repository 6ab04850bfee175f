"""Adapters that run other ecosystems' environments as Ludic envs, one module per ecosystem:
Gymnasium, reasoning-gym, TextArena, verifiers and OpenEnv. Importing this package imports none
of them; each is imported when an env is built, with a `pip install 'ludic[EXTRA]'` hint when
it is missing. The CLI reaches them as `--env PREFIX:TARGET` (`ludic.envs.registry`)."""

from ludic.envs.adapters._common import ansi_to_text, require
from ludic.envs.adapters.gymnasium import (
    GymnasiumEnv,
    discrete_action_parser,
    observation_state_key,
)
from ludic.envs.adapters.openenv import OpenEnvEnv
from ludic.envs.adapters.reasoning_gym import ReasoningGymEnv, answer_parser
from ludic.envs.adapters.textarena import TextArenaEnv, random_move_opponent
from ludic.envs.adapters.verifiers import VerifiersEnv

__all__ = [
    "GymnasiumEnv",
    "OpenEnvEnv",
    "ReasoningGymEnv",
    "TextArenaEnv",
    "VerifiersEnv",
    "ansi_to_text",
    "answer_parser",
    "discrete_action_parser",
    "observation_state_key",
    "random_move_opponent",
    "require",
]

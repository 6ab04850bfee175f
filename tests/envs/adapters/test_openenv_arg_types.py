"""OpenEnvEnv's own keywords (`action_field`, `observation_field`, `system_prompt`, `base_url`)
are checked by type when it is built, naming the keyword: `--env-kwargs
'{"observation_field": ["message"]}'` failed the first reset as "unhashable type: 'list'",
and `{"system_prompt": 3}` or `{"action_field": 5}` built an env without a word."""

from __future__ import annotations

import pytest

pytest.importorskip("openenv", reason="needs openenv-core: pip install 'ludic[openenv]'")

from test_openenv import GuessWordEnvironment

from ludic.envs.adapters.openenv import OpenEnvEnv
from ludic.errors import is_refusal


@pytest.mark.parametrize(
    ("keyword", "value"),
    [("observation_field", ["message"]), ("action_field", 5), ("system_prompt", 3)],
)
def test_a_wrong_type_is_refused_naming_the_keyword(keyword: str, value: object) -> None:
    with pytest.raises(TypeError, match=rf"OpenEnvEnv: {keyword} must be str or None, got ") as e:
        OpenEnvEnv(GuessWordEnvironment(), **{keyword: value})
    assert is_refusal(e.value)


async def test_right_types_build_and_reset() -> None:
    env = OpenEnvEnv(GuessWordEnvironment(), action_field="guess", system_prompt="Guess.")
    assert await env.reset(0) == {"agent_0": ("Guess the fruit.", {})}

"""reasoning-gym settings of the wrong type are refused naming the dataset, the setting and the
fix. ReasoningGymEnv takes the dataset's config fields as **config, so the up-front
`--env-kwargs` check could not see them, and reasoning-gym took any value: `{"level": "2"}`
failed inside it as "'<' not supported between instances of 'int' and 'str'", `{"size":
"10"}` as "'str' object cannot be interpreted as an integer"."""

from __future__ import annotations

import pytest

pytest.importorskip(
    "reasoning_gym", reason="needs reasoning-gym: pip install 'ludic[reasoning-gym]'"
)

from ludic.envs.adapters.reasoning_gym import ReasoningGymEnv


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"level": "2"},
            r"""reasoning-gym dataset 'countdown' takes 'level' as int or None, got "2" \(str\); """
            r"""write it without quotes: --env-kwargs '\{"level": 2\}'""",
        ),
        ({"level": 2.5}, r"""'level' as int or None, got 2.5 \(float\); pass int or None"""),
        ({"size": "10"}, r"""'size' as int, got "10" \(str\)"""),
        ({"dataset_seed": "1"}, r"""'dataset_seed' as int, got "1" \(str\)"""),
        (
            {"min_numbers": "4"},
            r"""'min_numbers' as int, got "4" \(str\); write it without quotes: """
            r"""--env-kwargs '\{"min_numbers": 4\}'""",
        ),
        ({"shuffle": "yes"}, r"""'shuffle' as true or false, got "yes" \(str\)"""),
    ],
)
def test_a_wrong_type_is_refused_naming_the_setting(
    settings: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ReasoningGymEnv("countdown", **settings)  # type: ignore[arg-type]


def test_right_types_pass() -> None:
    env = ReasoningGymEnv("countdown", level=1, min_numbers=3, size=10, dataset_seed=1)
    observation, _ = env.env_reset(0)
    assert isinstance(observation, str) and observation

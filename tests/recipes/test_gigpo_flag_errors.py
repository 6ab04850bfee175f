"""An out-of-range `--gigpo.*` value is refused naming the flag and its value, on the path
`ludic train` / `ludic actor` take (`make_algorithm`) and on `ludic eval --credit gigpo`'s
(`GiGPOOptions.credit`)."""

from __future__ import annotations

import pytest

from ludic.recipes.algorithms import GiGPOOptions, make_algorithm


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (GiGPOOptions(gamma=2.0), "--gigpo.gamma 2.0: "),
        (GiGPOOptions(omega=-1.0), "--gigpo.omega -1.0: "),
        (GiGPOOptions(omega=float("nan")), "--gigpo.omega nan: "),
        (
            GiGPOOptions(omega=1.5, combine="seed003"),
            "--gigpo.omega 1.5 with --gigpo.combine seed003: ",
        ),
        (GiGPOOptions(default_step_reward=float("inf")), "--gigpo.default-step-reward inf: "),
    ],
)
def test_a_bad_gigpo_flag_is_refused_naming_the_flag(options: GiGPOOptions, named: str) -> None:
    for build in (lambda: make_algorithm("gigpo", gigpo=options), options.credit):
        with pytest.raises(ValueError) as refused:
            build()
        text = str(refused.value)
        assert text.startswith(named), text
        assert "GiGPO:" not in text  # the flag, not the class behind it

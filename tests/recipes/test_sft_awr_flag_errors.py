"""`ludic sft --algorithm awr` with an out-of-range `--awr-*` value is refused naming that flag
(the AWRCredit field it sets is what the check knows; a CLI user knows the flag)."""

from __future__ import annotations

import pytest
import tyro

from ludic.recipes.configs import SFTConfig
from ludic.recipes.sft import offline_algorithm


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--awr-beta", "0"], "--awr-beta 0.0"),
        (["--awr-max-weight", "-1"], "--awr-max-weight -1.0"),
        (["--awr-state-prior", "-1"], "--awr-state-prior -1.0"),
        (["--awr-baseline", "value", "--awr-value-folds", "1"], "--awr-value-folds 1"),
        (["--awr-min-weight", "30"], "--awr-min-weight 30.0"),
    ],
)
def test_a_bad_awr_flag_is_refused_naming_the_flag(flags: list[str], named: str) -> None:
    cfg = tyro.cli(SFTConfig, args=["--data", "x.jsonl", "--algorithm", "awr", *flags])
    with pytest.raises(ValueError) as refused:
        offline_algorithm(cfg)
    text = str(refused.value)
    assert text.startswith(f"{named}: "), text
    assert "AWRCredit" not in text  # the flag, not the class behind it

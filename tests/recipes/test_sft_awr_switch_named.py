"""`ludic sft --algorithm sft` with an AWR switch names the switch as typed
(`--awr-state-normalize`), not as `--awr-state-normalize True`."""

from __future__ import annotations

import pytest
import tyro

from ludic.recipes.configs import SFTConfig
from ludic.recipes.sft import awr_flags_given, offline_algorithm


def test_a_switch_is_named_as_typed() -> None:
    cfg = tyro.cli(
        SFTConfig, args=["--data", "x.jsonl", "--awr-state-normalize", "--awr-beta", "0.5"]
    )
    assert awr_flags_given(cfg) == ["--awr-beta 0.5", "--awr-state-normalize"]
    with pytest.raises(ValueError) as refused:
        offline_algorithm(cfg)
    assert str(refused.value).startswith("--awr-beta 0.5 --awr-state-normalize apply only to")

"""`write_viewer(max_episodes=N)` / `ludic view --max-episodes N` refuses N < 1: -1 showed every
episode but the last (a Python slice), 0 wrote an empty page, both without a word."""

from __future__ import annotations

from pathlib import Path

import pytest
from viz_fakes import all_rollouts

from ludic.viz import write_viewer


@pytest.mark.parametrize("bad", [0, -1])
async def test_max_episodes_below_one_is_refused(tmp_path: Path, bad: int) -> None:
    with pytest.raises(ValueError, match=rf"--max-episodes\) must be >= 1 .*got {bad}"):
        write_viewer(await all_rollouts(), tmp_path / "v.html", max_episodes=bad)
    assert not (tmp_path / "v.html").exists()


async def test_max_episodes_keeps_the_first_n(tmp_path: Path) -> None:
    rollouts = await all_rollouts()
    page = write_viewer(rollouts, tmp_path / "v.html", max_episodes=1).read_text()
    assert rollouts[0].id in page and rollouts[-1].id not in page

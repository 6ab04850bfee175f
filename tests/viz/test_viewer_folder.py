"""`ludic view DIR` on the folder `ludic eval` (or `ludic train`) wrote names the rollouts.jsonl
inside it, instead of saying there is no rollout file at all."""

from __future__ import annotations

from pathlib import Path

import pytest
from viz_fakes import all_rollouts

from ludic.rollouts import write_rollouts_jsonl
from ludic.viz import write_viewer


async def test_a_run_folder_names_the_rollouts_file_inside_it(tmp_path: Path) -> None:
    out_dir = tmp_path / "eval"
    write_rollouts_jsonl(await all_rollouts(), out_dir / "rollouts.jsonl")
    with pytest.raises(FileNotFoundError) as caught:
        write_viewer(out_dir, tmp_path / "v.html")
    inside = out_dir / "rollouts.jsonl"
    assert str(caught.value) == (
        f"{out_dir} is a folder, not a rollout file; its rollouts are in {inside}: "
        f"`ludic view {inside}`"
    )
    assert write_viewer(inside, tmp_path / "v.html").is_file()  # the file it names opens


def test_a_folder_without_rollouts_is_no_rollout_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no rollout file at"):
        write_viewer(tmp_path, tmp_path / "v.html")

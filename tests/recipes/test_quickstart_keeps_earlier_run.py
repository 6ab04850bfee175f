"""A quickstart rerun into the same --out-dir keeps the earlier run in a dated folder beside it
(its stage folders and summary files, named in one line) instead of deleting it; the new run
starts in an OUT_DIR without them, and its run lock stays where it is."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

from rich.console import Console

from ludic.recipes.quickstart import _keep_earlier_run
from ludic.recipes.run_lock import RUN_LOCK

WHEN = 1_700_000_000  # when the earlier run last wrote


def earlier_run(out: Path) -> None:
    (out / "rl" / "checkpoints" / "step_00000040").mkdir(parents=True)
    (out / "eval" / "after_RL").mkdir(parents=True)
    (out / "results.json").write_text('{"stages": []}\n')
    (out / RUN_LOCK).write_text("held by this run\n")
    for path in (out / "rl", out / "eval", out / "results.json"):
        os.utime(path, (WHEN, WHEN))


def test_a_rerun_keeps_the_earlier_run_in_a_dated_folder(tmp_path: Path) -> None:
    out = tmp_path / "quickstart"
    earlier_run(out)
    console = Console(record=True, width=400)
    kept = _keep_earlier_run(out, console)

    stamp = datetime.datetime.fromtimestamp(WHEN).strftime("%Y%m%d-%H%M%S")
    assert kept == tmp_path / f"quickstart.{stamp}"
    assert (kept / "rl" / "checkpoints" / "step_00000040").is_dir()
    assert (kept / "results.json").read_text() == '{"stages": []}\n'
    assert sorted(p.name for p in out.iterdir()) == [RUN_LOCK]  # this run's lock stays
    said = " ".join(console.export_text().split())
    assert f"kept the earlier quickstart run in {out} (eval/, rl/, results.json) as {kept}" in said

    earlier_run(out)  # a third run: the same stamp is taken, the name gets a number
    assert _keep_earlier_run(out, console) == kept.with_name(f"quickstart.{stamp}-2")


def test_a_first_run_keeps_nothing(tmp_path: Path) -> None:
    out = tmp_path / "quickstart"
    out.mkdir()
    console = Console(record=True)
    assert _keep_earlier_run(out, console) is None
    assert console.export_text() == "" and list(tmp_path.iterdir()) == [out]

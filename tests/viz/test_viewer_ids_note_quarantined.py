"""`ludic view`'s tokenizer hint names the newest complete checkpoint, the one resume takes:
never a quarantined `step_N.corrupt` (which sorts after `step_N`), a save's scratch folder, or
a `step_N` without its MANIFEST.json (a save that never finished, which resume skips)."""

from __future__ import annotations

from pathlib import Path

from ludic.viz.viewer import ids_note


def _checkpoint(path: Path, *, complete: bool = True) -> None:
    (path / "model").mkdir(parents=True)
    (path / "model" / "tokenizer_config.json").write_text("{}")
    if complete:
        (path / "MANIFEST.json").write_text("{}")


def test_the_hint_skips_a_quarantined_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "train"
    for step in ("step_00000010", "step_00000012.corrupt", "step_00000013.tmp"):
        _checkpoint(run / "checkpoints" / step)
    note = ids_note(run / "rollouts.jsonl")
    assert f"--tokenizer {run / 'checkpoints' / 'step_00000010' / 'model'})" in note, note


def test_the_hint_skips_a_partial_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "train"
    _checkpoint(run / "checkpoints" / "step_00000002")
    _checkpoint(run / "checkpoints" / "step_00000004", complete=False)
    note = ids_note(run / "rollouts.jsonl")
    assert f"--tokenizer {run / 'checkpoints' / 'step_00000002' / 'model'})" in note, note

"""`ludic view`'s tokenizer hint names the newest real checkpoint, never a quarantined
`step_N.corrupt` (which sorts after `step_N`) or a save's scratch folder."""

from __future__ import annotations

from pathlib import Path

from ludic.viz.viewer import ids_note


def test_the_hint_skips_a_quarantined_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "train"
    for step in ("step_00000010", "step_00000012.corrupt", "step_00000013.tmp"):
        (run / "checkpoints" / step / "model").mkdir(parents=True)
        (run / "checkpoints" / step / "model" / "tokenizer_config.json").write_text("{}")
    note = ids_note(run / "rollouts.jsonl")
    assert f"--tokenizer {run / 'checkpoints' / 'step_00000010' / 'model'})" in note, note

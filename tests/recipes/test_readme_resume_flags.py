"""README "Checkpoints and resume" names every flag `ludic train --resume` refuses when it differs
from the checkpoint's: each flag `run_settings` records, other than the truncation ones a resume
may change (`--max-tokens`, `--max-steps`). It named neither `--problems-per-step` nor `--seed`."""

from __future__ import annotations

from pathlib import Path

from ludic.recipes.configs import TrainConfig
from ludic.recipes.train_checks import run_settings

README = Path(__file__).resolve().parents[2] / "README.md"


def _section(heading: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(heading)
    ends = [text.find(mark, start + len(heading)) for mark in ("\n## ", "\n### ")]
    return " ".join(text[start : min(e for e in ends if e != -1)].split())


def test_every_recorded_flag_is_named_among_the_refused_ones() -> None:
    section = _section("### Checkpoints and resume")
    start = section.index("`ludic train ... --resume`")
    sentence = section[start : section.index("which the checkpoint records", start)]
    recorded = run_settings(TrainConfig(), {})
    refused = [f for f in recorded if f not in ("--max-tokens", "--max-steps")]
    missing = [f for f in refused if f"`{f}`" not in sentence]
    assert not missing, f"README's --resume refusal list misses {missing}"
    assert "`--gigpo.*`" in sentence  # recorded under --algorithm gigpo only

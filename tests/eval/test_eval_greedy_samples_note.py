"""`ludic eval --temperature 0 --samples-per-problem K` says that greedy samples repeat one
another, so pass@K is pass@1: it printed a pass@K column that measured nothing more, without a
word."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from ludic.eval.command import EvalConfig, greedy_repeats_note, run_eval_command


@pytest.mark.parametrize(
    ("temperature", "samples", "noted"), [(0.0, 4, True), (0.0, 1, False), (0.7, 4, False)]
)
def test_the_note_only_for_greedy_repeats(temperature: float, samples: int, noted: bool) -> None:
    cfg = EvalConfig(env="tictactoe", temperature=temperature, samples_per_problem=samples)
    note = greedy_repeats_note(cfg)
    assert (note is not None) == noted
    if note is not None:
        assert "the 4 samples of each problem repeat one another" in note
        assert "pass@4 and mean@4 then equal pass@1 and mean@1" in note


@pytest.mark.slow
def test_ludic_eval_prints_it_before_evaluating(tmp_path: Path) -> None:
    console = Console(record=True, width=400)
    cfg = EvalConfig(
        env="tictactoe",
        temperature=0.0,
        num_problems=1,
        samples_per_problem=2,
        max_steps=1,
        max_tokens=2,
        threads=1,
        out_dir=tmp_path / "eval",
        progress=False,
    )
    result = run_eval_command(cfg, console=console)
    text = console.export_text()
    assert "note: --temperature 0 decodes greedily, so the 2 samples" in text
    assert text.index("note: --temperature 0") < text.index("ludic eval: tictactoe")
    first, second = (r.agent_steps[0].completion for r in result.rollouts)
    assert first == second  # what the note says: greedy samples repeat

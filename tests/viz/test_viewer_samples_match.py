"""`ludic view --samples` with a samples JSONL from another run (no sample belongs to these
rollouts): the page would show no sample tokens or weights without a word; it now warns,
naming both files and the fix. Samples of the same rollouts stay quiet."""

from __future__ import annotations

from pathlib import Path

from ludic.rollouts import build_samples
from ludic.types import AgentStep, Rollout, TokenTrace
from ludic.viz.viewer import write_viewer


def episode(text: str) -> Rollout:
    step = AgentStep(
        turn_id="t0",
        prompt_messages=({"role": "user", "content": "Lamp?"},),
        completion=text,
        trace=TokenTrace(prompt_token_ids=(76, 63), completion_token_ids=tuple(text.encode())),
        finish_reason="stop",
    )
    return Rollout(steps=[step])


def samples_of(rollouts: list[Rollout]) -> list:
    weights = {(r.id, t.turn_id): 1.0 for r in rollouts for t in r.turns()}
    return build_samples(rollouts, weights)


def test_samples_of_other_rollouts_warn_naming_the_fix(tmp_path: Path) -> None:
    shown = [episode("2"), episode("3")]
    other_run = samples_of([episode("4")])
    warnings: list[str] = []
    write_viewer(shown, tmp_path / "page.html", samples=other_run, on_warning=warnings.append)
    (warning,) = warnings
    assert "none of the 1 samples" in warning and "2 episodes shown" in warning
    assert "samples.jsonl written beside these rollouts" in warning


def test_samples_of_these_rollouts_are_quiet(tmp_path: Path) -> None:
    shown = [episode("2"), episode("3")]
    warnings: list[str] = []
    write_viewer(
        shown, tmp_path / "page.html", samples=samples_of(shown[:1]), on_warning=warnings.append
    )
    assert warnings == []

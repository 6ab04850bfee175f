"""`ludic view` without --tokenizer on a model's rollouts (ids that are not byte-level, as every
`ludic train` and `ludic eval` run writes) says the page shows token ids and what to pass to see
text, naming the run's newest checkpoint when the rollouts sit in a run folder; it used to say
only where it wrote the page."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from ludic.rollouts import write_rollouts_jsonl
from ludic.types import AgentStep, Rollout, TokenTrace
from ludic.viz.viewer import ViewConfig, view_command


def model_rollouts() -> list[Rollout]:
    """One episode whose ids are a model tokenizer's (above the byte-level vocabulary)."""
    step = AgentStep(
        turn_id="t0",
        prompt_messages=({"role": "user", "content": "Your move?"},),
        completion="<move>5</move>",
        trace=TokenTrace(prompt_token_ids=(300, 301, 302), completion_token_ids=(354, 25, 355)),
        finish_reason="stop",
    )
    return [Rollout(steps=[step])]


def view(rollouts: Path, *flags: str) -> str:
    out = io.StringIO()
    cfg = ViewConfig(rollouts=rollouts, tokenizer=flags[0] if flags else None)
    view_command(cfg, console=Console(file=out, width=1000))
    return out.getvalue()


def test_ids_page_names_the_run_checkpoint_to_pass(tmp_path: Path) -> None:
    run = tmp_path / "train"
    write_rollouts_jsonl(model_rollouts(), run / "rollouts.jsonl")
    for step in ("step_00000001", "step_00000002"):
        (run / "checkpoints" / step / "model").mkdir(parents=True)
        (run / "checkpoints" / step / "model" / "tokenizer_config.json").write_text("{}")
        (run / "checkpoints" / step / "MANIFEST.json").write_text("{}")
    printed = view(run / "rollouts.jsonl")
    newest = run / "checkpoints" / "step_00000002" / "model"
    assert (
        "its tokens are shown as ids (no --tokenizer given): to see them as text, pass "
        f"--tokenizer with the model directory that generated them (this run's: --tokenizer "
        f"{newest})"
    ) in printed


def test_ids_page_without_checkpoints_says_where_one_is(tmp_path: Path) -> None:
    write_rollouts_jsonl(model_rollouts(), tmp_path / "rollouts.jsonl")
    printed = view(tmp_path / "rollouts.jsonl")
    assert "shown as ids (no --tokenizer given)" in printed
    assert "(a run's checkpoint .../checkpoints/step_N/model)" in printed


def test_ids_asked_for_get_no_note(tmp_path: Path) -> None:
    write_rollouts_jsonl(model_rollouts(), tmp_path / "rollouts.jsonl")
    assert "shown as ids" not in view(tmp_path / "rollouts.jsonl", "ids")

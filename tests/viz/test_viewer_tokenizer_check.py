"""`ludic view --tokenizer` with another model's tokenizer warns, naming the mismatch (the check
`ludic sft` refuses such data with, `ludic.rollouts.token_check`), and the page says its tokens
are not these rollouts' tokenizer's; the right tokenizer, plain ids and auto-detection stay
quiet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from ludic.models import load_tokenizer, tiny_model_dir, train_tiny_tokenizer
from ludic.rollouts import write_rollouts_jsonl
from ludic.rollouts.token_check import foreign_token_ids
from ludic.types import AgentStep, Rollout, TokenTrace
from ludic.viz.viewer import TokenizerMismatchWarning, write_viewer

MOVES = ["<move>4</move>", "<move>7</move>", "I pick <move>9</move>"]


def rollouts_from(tokenizer: object) -> list[Rollout]:
    """Episodes whose ids are `tokenizer`'s, as the embedded engine records them (the chat
    template's prompt ids, the completion's ids and the end-of-turn token)."""
    out = []
    for move in MOVES:
        messages = ({"role": "user", "content": "Your move?"},)
        prompt = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
            list(messages), add_generation_prompt=True, tokenize=True, return_dict=False
        )
        completion = tokenizer.encode(move, add_special_tokens=False)  # type: ignore[attr-defined]
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")  # type: ignore[attr-defined]
        step = AgentStep(
            turn_id="t0",
            prompt_messages=messages,
            completion=move,
            trace=TokenTrace(
                prompt_token_ids=tuple(prompt), completion_token_ids=(*completion, eos)
            ),
            finish_reason="stop",
        )
        out.append(Rollout(steps=[step]))
    return out


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(rollouts.jsonl made with the tiny model's tokenizer, that model's directory, another
    task's tokenizer directory: a BPE trained on other text with <move> as one token)."""
    root = tmp_path_factory.mktemp("view")
    model_dir = tiny_model_dir()
    rollouts = root / "rollouts.jsonl"
    write_rollouts_jsonl(rollouts_from(load_tokenizer(model_dir)), rollouts)
    corpus = "\n".join(f"the lights look good {i} <move>{i}</move>" for i in range(10)) * 30
    other = train_tiny_tokenizer(vocab_size=320, corpus=corpus, extra_tokens=("<move>",))
    other.save_pretrained(root / "lights")
    return rollouts, model_dir, root / "lights"


def page_tokenizer(html: Path) -> str:
    text = html.read_text(encoding="utf-8")
    start = text.index('"tokenizer":') + len('"tokenizer":')
    return str(json.JSONDecoder().raw_decode(text[start:])[0])


def view(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ludic.cli", "view", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        env={**os.environ, "COLUMNS": "1000"},
    )


def test_ludic_view_with_another_models_tokenizer_warns(dirs, tmp_path: Path) -> None:
    rollouts, _, lights = dirs
    result = view(rollouts, "--tokenizer", lights, "--out", tmp_path / "p.html", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert f"warning: the token ids in {rollouts} are not those of {lights}" in out
    assert "'<move>4</move>' decodes to" in out
    assert "Pass --tokenizer with the model directory that generated them" in out
    assert page_tokenizer(tmp_path / "p.html") == f"{lights} (NOT these rollouts' tokenizer)"


def test_ludic_view_with_the_right_tokenizer_is_quiet(dirs, tmp_path: Path) -> None:
    rollouts, model_dir, _ = dirs
    result = view(rollouts, "--tokenizer", model_dir, "--out", tmp_path / "p.html", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stdout + result.stderr
    # the directory as given: a checkpoint's tokenizer folder is always named `model`
    assert page_tokenizer(tmp_path / "p.html") == str(model_dir)


def test_write_viewer_checks_tokenizer_objects_and_bytes(dirs, tmp_path: Path) -> None:
    rollouts, model_dir, lights = dirs
    warned: list[str] = []
    for i, tokenizer in enumerate([load_tokenizer(model_dir), "ids", None]):
        write_viewer(
            rollouts, tmp_path / f"{i}.html", tokenizer=tokenizer, on_warning=warned.append
        )
    assert warned == []
    other = load_tokenizer(lights)
    write_viewer(rollouts, tmp_path / "d.html", tokenizer=other, on_warning=warned.append)
    write_viewer(rollouts, tmp_path / "e.html", tokenizer="bytes", on_warning=warned.append)
    assert len(warned) == 2
    assert f"are not those of {lights}:" in warned[0]  # where the tokenizer object came from
    assert "are not those of bytes:" in warned[1]
    with pytest.warns(TokenizerMismatchWarning, match="'<move>4</move>' decodes to"):
        write_viewer(rollouts, tmp_path / "f.html", tokenizer=str(lights))


def test_the_check_ignores_whitespace_lost_by_per_token_decoding() -> None:
    """A SentencePiece tokenizer decoded one token at a time drops the spaces; that is the
    right tokenizer, not a foreign one."""
    step = AgentStep(
        turn_id="t0",
        completion="I pick <move>9</move>",
        trace=TokenTrace(prompt_token_ids=(1,), completion_token_ids=(5, 6, 7)),
    )

    def squashed(ids: Sequence[int]) -> str:
        return "Ipick<move>9</move>"

    def other(ids: Sequence[int]) -> str:
        return " looks9 good"

    assert foreign_token_ids([Rollout(steps=[step])], [squashed]) is None
    foreign = foreign_token_ids([Rollout(steps=[step])], [other])
    assert foreign is not None and (foreign.checked, foreign.decoded) == (1, " looks9 good")


def test_the_pages_tokenizer_says_where_it_was_loaded_from(dirs, tmp_path: Path) -> None:
    rollouts, model_dir, _ = dirs
    tokenizer = load_tokenizer(model_dir)
    write_viewer(rollouts, tmp_path / "a.html", tokenizer=tokenizer)
    assert page_tokenizer(tmp_path / "a.html") == str(model_dir)  # not the class name
    tokenizer.name_or_path = ""  # built in memory: only the class is known
    write_viewer(rollouts, tmp_path / "b.html", tokenizer=tokenizer)
    assert page_tokenizer(tmp_path / "b.html") == type(tokenizer).__name__

"""`examples/tictactoe/eval.py` on a local model prints the `ludic view` command with
`--tokenizer MODEL`, as `ludic eval` does: without it the page it names shows token ids."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.examples.test_examples import load_example

from ludic.models import tiny_model_dir


def test_the_printed_view_command_names_the_models_tokenizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = load_example("tictactoe/eval.py")
    model = str(tiny_model_dir())
    example.main(example.EvalConfig(episodes=2, out_dir=tmp_path, model=model))
    printed = capsys.readouterr().out
    assert f"ludic view {tmp_path / 'rollouts.jsonl'} --tokenizer {model})" in printed, printed

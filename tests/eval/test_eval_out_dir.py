"""`ludic eval` never silently replaces an earlier run's records: an --out-dir (the default
ludic_runs/eval included) holding them is refused, naming --out-dir and --overwrite, as
`ludic train` refuses an out-dir holding an earlier run's checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from ludic.errors import is_refusal
from ludic.eval.command import EvalConfig, run_eval_command


def earlier_eval(out_dir: Path) -> dict[str, str]:
    out_dir.mkdir(parents=True)
    files = {"metrics.json": '{"episodes": 99}\n', "rollouts.jsonl": "", "credit.jsonl": "{}\n"}
    for name, text in files.items():
        (out_dir / name).write_text(text)
    return files


def test_the_default_out_dir_holding_an_earlier_eval_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    files = earlier_eval(tmp_path / "ludic_runs" / "eval")
    # Refused before any model loads: --model names nothing that exists.
    cfg = EvalConfig(env="eval_fakes:QuizEnv", model=str(tmp_path / "none"), progress=False)
    with pytest.raises(FileExistsError) as refused:
        run_eval_command(cfg, console=Console(record=True))
    message = str(refused.value)
    assert "ludic_runs/eval holds an earlier run's records" in message
    assert "metrics.json" in message and "--out-dir" in message and "--overwrite" in message
    assert is_refusal(refused.value)  # the CLI prints it as `ludic eval: error: ...`
    for name, text in files.items():  # untouched
        assert (tmp_path / "ludic_runs" / "eval" / name).read_text() == text


def test_overwrite_replaces_the_earlier_records_and_says_so(tmp_path: Path) -> None:
    from ludic.models import tiny_model_dir

    out = tmp_path / "eval"
    earlier_eval(out)
    console = Console(record=True, width=200)
    cfg = EvalConfig(
        env="eval_fakes:QuizEnv",
        model=str(tiny_model_dir()),
        num_problems=1,
        max_steps=1,
        max_tokens=2,
        out_dir=out,
        overwrite=True,
        progress=False,
    )
    (out / "rollouts.html").write_text("<html>the earlier episodes</html>")  # `ludic view`'s
    run_eval_command(cfg, console=console)
    text = console.export_text()
    assert f"--overwrite: deleted the earlier run's records in {out}" in text
    assert not (out / "rollouts.html").exists()  # a page that would show the earlier episodes
    assert json.loads((out / "metrics.json").read_text())["episodes"] == 1
    assert not (out / "credit.jsonl").exists()  # no stale file from the earlier run is left

"""examples/awr_tictactoe.py: calls into one --out-dir merge (a second call used to rewrite
results.json with its own runs only, and replay and rewrite seed_N/data under the first call's
runs); a call with other settings is refused before anything is written; the summary prints
rates in percent (they were signed fractions, "win +0.625", under the table's percents)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import tyro
from test_examples import config, load_example

TINY: dict[str, Any] = {
    "expert_episodes": 4,
    "expert_epsilons": (0.0, 1.0),
    "steps": 1,
    "batch_size": 4,
    "eval_episodes": 2,
    "hidden_size": 64,
    "seeds": 1,
}


def results(out: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((out / "results.json").read_text())
    return loaded


@pytest.mark.slow
def test_calls_into_one_out_dir_merge_and_other_settings_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # one summary row per line
    example = load_example("awr_tictactoe.py")
    run = lambda **kw: example.main(config(example, "AWRConfig", out_dir=tmp_path, **TINY, **kw))  # noqa: E731

    run(methods=("sft",))
    games = (tmp_path / "seed_0" / "data" / "all.jsonl").read_bytes()
    assert set(results(tmp_path)["runs"]) == {"sft"}
    capsys.readouterr()

    second = run(methods=("awr",))  # the same seed: awr beside the first call's sft
    assert set(second) == {"awr"}
    assert (tmp_path / "seed_0" / "data" / "all.jsonl").read_bytes() == games  # played once
    merged = results(tmp_path)
    assert set(merged["runs"]) == {"sft", "awr"} and merged["seeds"] == [0]
    assert set(merged["summary"]) == {"sft", "awr", "awr - sft"}
    seed_record = json.loads((tmp_path / "seed_0" / "result.json").read_text())
    assert {"sft", "awr"} <= set(seed_record)
    sft, awr = merged["runs"]["sft"][0], merged["runs"]["awr"][0]
    diff = merged["summary"]["awr - sft"]["win"]["mean"]
    assert diff == pytest.approx(awr["win"] - sft["win"])

    printed = capsys.readouterr().out
    win = 100 * merged["summary"]["sft"]["win"]["mean"]
    sft_row = f"sft: win {win:.1f}% (one seed: no interval), illegal moves "
    assert re.search("^" + re.escape(sft_row), printed, re.M)
    assert re.search("^" + re.escape(f"awr - sft: win {100 * diff:+.1f} points"), printed, re.M)
    assert "mean reward " in printed
    assert not re.search(r"win [+-]?[01]\.\d{3}", printed)  # no more signed fractions

    run(methods=("sft",), first_seed=1)  # another seed, one method
    merged = results(tmp_path)
    assert merged["seeds"] == [0, 1] and [r["seed"] for r in merged["runs"]["sft"]] == [0, 1]
    assert merged["summary"]["sft"]["win"]["n"] == 2
    assert merged["summary"]["awr - sft"]["win"]["n"] == 1  # seed 1 has no awr run
    assert [d["seed"] for d in merged["data"]] == [0, 1]

    before = results(tmp_path)
    with pytest.raises(ValueError, match=r"--beta 0\.5 there, 1\.0 here.*another --out-dir"):
        run(methods=("awr",), first_seed=2, beta=1.0)
    assert not (tmp_path / "seed_2").exists() and results(tmp_path) == before


def test_help_text_of_out_dir_says_calls_merge(capsys: pytest.CaptureFixture[str]) -> None:
    example = load_example("awr_tictactoe.py")
    with pytest.raises(SystemExit):
        tyro.cli(example.AWRConfig, args=["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Calls into one out-dir merge" in text
    assert "Refused, before anything is written, when earlier results there came from other" in text

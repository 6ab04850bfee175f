"""`ludic quickstart --tiny` end to end: every stage runs, the outputs exist, the table parses."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from ludic.models import load_tokenizer

STAGES = ("before SFT", "after SFT", "after RL")
ROW = re.compile(
    r"(before SFT|after SFT|after RL)\s*│\s*(\d+)%\s*│\s*(\d+)%\s*│\s*(\d+)%\s*│\s*(\d+)%"
    r"\s*│\s*([+-]\d+\.\d+)"
)


def parse_table(text: str) -> dict[str, tuple[float, ...]]:
    """{stage: (win, draw, loss, illegal, mean reward)} from the printed results table."""
    rows = {}
    for match in ROW.finditer(text):
        stage, *rates, reward = match.groups()
        rows[stage] = (*(float(r) / 100 for r in rates), float(reward))
    return rows


@pytest.mark.slow
def test_quickstart_tiny_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "run"
    stale = out / "rl" / "checkpoints" / "step_99999999"  # an earlier, longer run's (review)
    stale.mkdir(parents=True)
    script = Path(sys.executable).parent / "ludic"
    result = subprocess.run(
        [str(script), "quickstart", "--tiny", "--out-dir", str(out), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "120"},
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not (out / "run.lock").exists()  # held by the whole command, gone at its end
    assert not stale.exists() and "kept the earlier quickstart run in" in result.stdout
    (kept,) = tmp_path.glob("run.*")  # the earlier run, in a dated folder beside OUT_DIR
    assert (kept / "rl" / "checkpoints" / "step_99999999").is_dir()

    table = parse_table(result.stdout)
    assert tuple(table) == STAGES, result.stdout
    for win, draw, loss, illegal, _ in table.values():
        assert min(win, draw, loss, illegal) >= 0.0 and max(win, draw, loss, illegal) <= 1.0

    results = json.loads((out / "results.json").read_text())
    assert [s["stage"] for s in results["stages"]] == list(STAGES)
    for stage in results["stages"]:
        assert stage["episodes"] > 0
        assert table[stage["stage"]][4] == pytest.approx(stage["mean_reward"], abs=0.006)

    metrics = [json.loads(line) for line in (out / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == results["config"]["rl_steps"] and "batch/mean_reward" in metrics[0]
    assert (out / "sft" / "metrics.jsonl").is_file()
    png = (out / "reward_curve.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 1000
    with Image.open(out / "reward_curve.png") as image:
        title = image.info["Title"]
    assert title.startswith("GRPO on tic-tac-toe vs a random opponent: mean episode reward")
    assert set(results["stage_seconds"]) == {"eval", "expert data", "SFT", "RL"}
    assert sum(results["stage_seconds"].values()) <= results["seconds"]
    checkpoints = sorted((out / "rl" / "checkpoints").glob("step_*"))
    assert checkpoints and (checkpoints[-1] / "MANIFEST.json").is_file()
    assert (checkpoints[-1] / "model" / "config.json").is_file()
    assert (checkpoints[-1] / "model" / "tokenizer.json").is_file()
    assert sorted((out / "sft" / "checkpoints").glob("step_*"))
    kept = (out / "expert" / "kept.jsonl").read_text().splitlines()
    assert kept and all(json.loads(line)["steps"] for line in kept)
    for stage in ("before_SFT", "after_SFT", "after_RL"):
        assert (out / "eval" / stage / "rollouts.jsonl").is_file()
    # The model reads the compact board and was built with the game's own tokenizer.
    first = json.loads(kept[0])["steps"][0]
    assert first["prompt_messages"][-1]["content"] == "1|2|3\n4|5|6\n7|8|9\nX to move"
    assert len(first["trace"]["completion_token_ids"]) == 4  # <move> N </move> <|im_end|>
    tokenizer = load_tokenizer(checkpoints[-1] / "model")
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("<move>5</move>"))[0] == "<move>"
    assert_view_hint_shows_decoded_tokens(result.stdout, script, checkpoints[-1] / "model")


def assert_view_hint_shows_decoded_tokens(stdout: str, script: Path, model_dir: Path) -> None:
    """The closing `ludic view ...` hint, run as printed, writes a page whose tokens are the
    task tokenizer's strings (from the final checkpoint's model dir), not bare ids."""
    (hint,) = [line for line in stdout.splitlines() if line.startswith("look at the games: ")]
    command = shlex.split(hint.removeprefix("look at the games: "))
    assert command[:2] == ["ludic", "view"] and command[-2:] == ["--tokenizer", str(model_dir)]
    subprocess.run([str(script), *command[1:]], check=True, capture_output=True, timeout=120)
    page = Path(command[2]).with_suffix(".html").read_text()
    embedded = re.search(r'<script type="application/json"[^>]*>(.*?)</script>', page, re.S)
    assert embedded is not None
    data = json.loads(embedded.group(1))
    assert data["tokenizer"] == str(model_dir)  # "ids (no tokenizer given)" without it
    tokens = data["episodes"][0]["turns"][0]["samples"][0]["t"]
    assert tokens[0] == "<|im_start|>" and not any(re.fullmatch(r"\[\d+\]", t) for t in tokens)


def test_parse_table_reads_the_rich_table() -> None:
    text = (
        "│ before SFT │  0% │   0% │   0% │    100% │       -9.00 │\n"
        "│ after SFT  │ 25% │  10% │  40% │     25% │       -0.31 │\n"
        "│ after RL   │ 60% │   5% │  30% │      5% │       +0.30 │\n"
    )
    rows = parse_table(text)
    assert rows["after SFT"] == (0.25, 0.10, 0.40, 0.25, -0.31)
    assert rows["after RL"][4] == 0.30


def test_threads_below_one_is_refused_naming_the_flag(tmp_path: Path) -> None:
    """As `ludic train` and `ludic eval` refuse it: one line, no torch traceback."""
    result = subprocess.run(
        [sys.executable, "-m", "ludic.cli", "quickstart", "--tiny", "--threads", "0"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode != 0
    assert "--threads must be >= 1" in result.stderr and "Traceback" not in result.stderr

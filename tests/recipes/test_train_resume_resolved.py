"""`ludic train --resume` compares --context and --parser by what they resolve to on the env
(`auto` on tictactoe is `latest` and `xml_tag_parser('move')`), still refusing a real change
and naming what each side resolved to, and refuses another --seed (every env and sampling seed
of the batches after the checkpoint derives from it, so the resumed run would not equal the
uninterrupted one). Run as a user runs it: the `ludic` command in new processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tyro

from ludic.eval.env_spec import resolve_env_factory
from ludic.parsers import xml_tag_parser
from ludic.recipes.configs import TrainConfig
from ludic.recipes.train_checks import (
    RUN_SETTINGS_KEY,
    check_resume_settings,
    parser_identity,
    resume_resolvers,
    run_settings,
)

SMALL = (
    *("--env", "tictactoe", "--problems-per-step", "1", "--group-size", "2"),
    *("--max-tokens", "3", "--max-steps", "2", "--out-dir", "run", "--no-progress"),
)


def ludic_train(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ludic.cli", "train", *SMALL, *args],
        cwd=cwd,
        env={**os.environ, "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def refusal(cwd: Path, *args: str) -> str:
    done = ludic_train(cwd, "--steps", "2", "--resume", *args)
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = [line for line in done.stderr.splitlines() if "with other settings" in line]
    return line


@pytest.mark.slow
def test_resume_compares_what_context_and_parser_resolve_to_and_refuses_another_seed(
    tmp_path: Path,
) -> None:
    first = ludic_train(tmp_path, "--steps", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()

    line = refusal(tmp_path, "--context", "full")
    assert (
        "--context is full, the checkpoint's auto (on this env: full, the checkpoint's latest)"
        in line
    )
    assert "Pass the checkpoint's flags (--context auto) to continue it" in line
    line = refusal(tmp_path, "--parser", "xml:answer")
    assert (
        "--parser is xml:answer, the checkpoint's auto (on this env: xml_tag_parser('answer'), "
        "the checkpoint's xml_tag_parser('move'))" in line
    )
    line = refusal(tmp_path, "--seed", "1")
    assert "--seed is 1, the checkpoint's 0" in line
    assert "Pass the checkpoint's flags (--seed 0) to continue it" in line
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == metrics  # nothing trained

    # auto and the names it resolves to on tictactoe are the same run
    resumed = ludic_train(
        tmp_path, "--steps", "2", "--resume", "--context", "latest", "--parser", "xml:move"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "with other settings" not in resumed.stderr
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert steps == [1, 2]


def test_one_parser_name_with_another_penalty_is_another_parser(tmp_path: Path) -> None:
    """`--parser xml:move` on an env whose declared parser is xml_tag_parser("move",
    penalty=-0.5): the same name, another reward for a reply without the tag."""
    strict, lenient = xml_tag_parser("move"), xml_tag_parser("move", penalty=-0.5)
    assert parser_identity(strict) == parser_identity(xml_tag_parser("move"))
    assert parser_identity(strict) != parser_identity(lenient)

    def lenient_env(**kwargs: object) -> object:
        return resolve_env_factory("tictactoe")(**kwargs)

    lenient_env.parser = lenient  # type: ignore[attr-defined]  # what --parser auto takes
    path = tmp_path / "run" / "checkpoints" / "step_00000001"
    path.mkdir(parents=True)
    saved = TrainConfig(env="tictactoe")
    extra = {RUN_SETTINGS_KEY: run_settings(saved, {})}
    (path / "state.json").write_text(json.dumps({"step": 1, "extra": extra}))
    given = tyro.cli(
        TrainConfig,
        args=["--parser", "xml:move", "--out-dir", str(tmp_path / "run"), "--resume", str(path)],
    )
    resolve = resume_resolvers(given, lenient_env, {}, "latest", strict)
    with pytest.raises(ValueError, match="with other settings") as refused:
        check_resume_settings(given, {}, lambda _: None, resolve=resolve)
    message = str(refused.value)
    assert "--parser is xml:move, the checkpoint's auto (on this env: " in message
    assert "penalty=-1.0" in message and "penalty=-0.5" in message
    # the declared parser itself resumes
    same = tyro.cli(TrainConfig, args=["--out-dir", str(tmp_path / "run"), "--resume", str(path)])
    check_resume_settings(
        same, {}, lambda _: None, resolve=resume_resolvers(same, lenient_env, {}, "latest", lenient)
    )

"""`ludic eval` names an --env or --env-kwargs typo before refusing a reused --out-dir: the
out-dir refusal came first, so a user fixed (or --overwrite'd) the out-dir only to meet the
flag error next."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from ludic.eval.command import EvalConfig, run_eval_command


@pytest.fixture
def used_out_dir(tmp_path: Path) -> Path:
    out = tmp_path / "eval"
    out.mkdir()
    (out / "metrics.json").write_text('{"episodes": 3}\n')
    return out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            {"env": "eval_fakes:QuizEnv", "env_kwargs": "{'size': 3}"},
            r"--env-kwargs must be a JSON object",
        ),
        ({"env": "no_such_env"}, r"unknown env 'no_such_env'"),
    ],
)
def test_a_flag_error_is_named_before_the_out_dir_refusal(
    used_out_dir: Path, tmp_path: Path, flags: dict[str, str], message: str
) -> None:
    cfg = EvalConfig(**flags, model=str(tmp_path / "none"), out_dir=used_out_dir, progress=False)
    with pytest.raises(ValueError, match=message) as caught:
        run_eval_command(cfg, console=Console(record=True))
    assert "earlier run's records" not in str(caught.value)
    assert (used_out_dir / "metrics.json").read_text() == '{"episodes": 3}\n'  # untouched


def test_good_flags_still_meet_the_out_dir_refusal(used_out_dir: Path, tmp_path: Path) -> None:
    cfg = EvalConfig(env="eval_fakes:QuizEnv", env_kwargs="{}", out_dir=used_out_dir)
    with pytest.raises(FileExistsError, match=r"holds an earlier run's records"):
        run_eval_command(cfg, console=Console(record=True))

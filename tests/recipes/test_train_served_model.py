"""`ludic train --server-url` asks each server's `/v1/models` before the starting-weights push
and before any episode: a --served-model a server does not list, or (without the flag) a first
server's model another server does not list, is refused in one `ludic train: error:` line
naming what that server serves (instead of every episode failing with a 404). In-process
`main` against embedded HTTP servers in threads, all over one tiny engine."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from app_server import serving_app, tiny_app
from ludic.cli import main
from ludic.envs.single_agent import SingleAgentEnv
from ludic.types import Info, StepOutcome


class OneTurnEnv(SingleAgentEnv):
    """One step: any reply ends the episode with reward 1."""

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return f"question {seed}", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="done", reward=1.0, terminated=True, info={})


ENV = f"{__name__}:OneTurnEnv"
SMALL = ("--steps", "1", "--problems-per-step", "1", "--group-size", "2", "--max-tokens", "4")


@contextmanager
def serving(*names: str) -> Iterator[list[str]]:
    """One embedded HTTP server per name, each serving the tiny engine under that name (its
    `/v1/models` lists it), in threads; without a token, so a weight push is refused (403)."""
    with ExitStack() as stack:
        urls = []
        for name in names:
            app = stack.enter_context(tiny_app(name))
            urls.append(stack.enter_context(serving_app(app)))
        yield urls


def _refused_train(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], urls: list[str], *extra: str
) -> list[str]:
    """Run `ludic train` against `urls`; its `ludic train:` lines, once it exited refused
    before the starting-weights push and before any episode."""
    out_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "train",
                *("--env", ENV, "--server-url", *urls, "--server-token", "t", *extra),
                *("--out-dir", str(out_dir), "--no-progress", *SMALL),
            ],
            report_refusals=True,
        )
    assert exit_info.value.code == 1
    captured = capsys.readouterr()
    assert "pushed as policy version 0" not in captured.out  # no push was tried
    rollouts = out_dir / "rollouts.jsonl"
    assert not rollouts.exists() or not rollouts.read_text().strip()  # no episode was played
    return [line for line in captured.err.splitlines() if line.startswith("ludic train:")]


def test_a_served_model_the_server_does_not_list_is_refused_before_the_push(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving("tiny") as urls:
        refusal = _refused_train(tmp_path, capsys, urls, "--served-model", "no-such-model")
    assert refusal == [
        f"ludic train: error: --served-model no-such-model: the server at {urls[0]}/v1/models "
        "serves tiny, not no-such-model; pass --served-model tiny or leave the flag out"
    ]


def test_a_second_server_that_does_not_list_the_first_ones_model_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving("tiny", "other") as urls:
        refusal = _refused_train(tmp_path, capsys, urls)
    assert refusal == [
        f"ludic train: error: the model tiny (no --served-model: the one {urls[0]}/v1/models "
        f"lists): the server at {urls[1]}/v1/models serves other, not tiny; every --server-url "
        "gets the same model name: start them all serving one model, or pass --served-model "
        "with a name each of them lists"
    ]

"""`ludic eval --server-url URL --served-model NAME` asks the server's `/v1/models` once before
any episode: a name it does not list is refused in one line naming what it serves and the flag
(instead of every episode failing with a 404), and a server without `/v1/models` still
evaluates the name it is given."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from app_server import serving_app, tiny_app
from ludic.cli import main
from ludic.envs.single_agent import SingleAgentEnv
from ludic.eval.command import EvalConfig, run_eval_command
from ludic.types import Info, StepOutcome


class OneQuestionEnv(SingleAgentEnv):
    """One step: any reply ends the episode with reward 1."""

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return f"question {seed}", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="done", reward=1.0, terminated=True, info={})


ENV = f"{__name__}:OneQuestionEnv"
SMALL = ("--num-problems", "2", "--max-steps", "1", "--max-tokens", "4", "--no-progress")


@contextmanager
def serving(*, without_models_route: bool = False) -> Iterator[str]:
    """The embedded HTTP server over the tiny model, serving it as "tiny", in a thread; with
    `without_models_route` it has no `/v1/models` (as some OpenAI-compatible servers)."""
    with tiny_app() as app:
        if without_models_route:
            app.router.routes[:] = [
                r for r in app.router.routes if getattr(r, "path", None) != "/v1/models"
            ]
        with serving_app(app) as url:
            yield f"{url}/v1"


def test_a_served_model_the_server_does_not_list_is_refused_before_any_episode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "eval"
    out_dir.mkdir()
    earlier = out_dir / "metrics.json"
    earlier.write_text("{}\n")  # an earlier run's record, which --overwrite would delete
    with serving() as url, pytest.raises(SystemExit) as exit_info:
        main(
            [
                "eval",
                *("--env", ENV, "--server-url", url, "--served-model", "no-such-model"),
                *("--out-dir", str(out_dir), "--overwrite", *SMALL),
            ],
            report_refusals=True,
        )
    assert exit_info.value.code == 1
    err = capsys.readouterr().err  # also the server's weight-loading bar, from its thread
    refusal = [line for line in err.splitlines() if line.startswith("ludic eval:")]
    models = url.removesuffix("/v1") + "/v1/models"
    assert refusal == [
        f"ludic eval: error: --served-model no-such-model: the server at {models} serves tiny, "
        "not no-such-model; pass --served-model tiny or leave the flag out"
    ], err
    assert sorted(p.name for p in out_dir.iterdir()) == ["metrics.json"]  # no episode ran
    assert earlier.read_text() == "{}\n"  # refused before --overwrite deleted anything


def test_a_server_without_v1_models_still_evaluates_the_named_model(tmp_path: Path) -> None:
    with serving(without_models_route=True) as url:
        assert httpx.get(url + "/models", timeout=10).status_code == 404
        result = run_eval_command(
            EvalConfig(
                env=ENV,
                server_url=url,
                served_model="tiny",
                num_problems=2,
                max_steps=1,
                max_tokens=4,
                out_dir=tmp_path / "eval",
                progress=False,
            ),
            console=Console(record=True),
        )
    assert [e.failed for e in result.episodes] == [False, False], result.rollouts
    assert (tmp_path / "eval" / "rollouts.jsonl").exists()

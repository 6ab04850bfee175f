"""`ludic train --local-server` on a model with a short context (max_position_embeddings 160),
run as a user runs it (the `ludic` command in a new process). A --max-tokens at or past that
context is refused before the weights are saved or the server started, naming the model's
context and the flag to change (the server's own refusal, after it had started, named its URL
and `ludic serve --max-model-len`, a flag --local-server does not take); one under it trains."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ludic.models.tiny import TinyModelSpec, tiny_model_dir
from ludic.recipes.train_local_server import LOCAL_SERVER_LOG

HERE = Path(__file__).parent
CONTEXT = 160
FLAGS = (
    *("--env", "resume_envs:SayOTwiceEnv", "--local-server", "--no-progress"),
    *("--problems-per-step", "2", "--group-size", "2", "--max-steps", "2", "--steps", "1"),
)


@pytest.fixture(scope="module")
def short_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = TinyModelSpec(max_position_embeddings=CONTEXT)
    return tiny_model_dir(spec=spec, cache_dir=tmp_path_factory.mktemp("models"))


def _train(out_dir: Path, model: Path, max_tokens: int) -> subprocess.CompletedProcess[str]:
    ludic = Path(sys.executable).parent / "ludic"
    head = [str(ludic)] if ludic.exists() else [sys.executable, "-m", "ludic.cli"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    args = [*FLAGS, "--model", str(model), "--max-tokens", str(max_tokens)]
    command = [*head, "train", *args, "--out-dir", str(out_dir)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def test_max_tokens_at_the_context_is_refused_before_the_server_starts(
    short_model: Path, tmp_path: Path
) -> None:
    done = _train(tmp_path / "run", short_model, CONTEXT)
    said = " ".join((done.stdout + done.stderr).split())  # rich wraps long lines
    assert done.returncode == 1, said
    assert (
        f"--max-tokens {CONTEXT} leaves no room for a prompt: --local-server serves the model "
        f"with its context of {CONTEXT} tokens"
    ) in said
    assert f"pass --max-tokens below {CONTEXT}" in said
    assert "local server: `ludic serve` pid" not in said  # no server was started
    assert not (tmp_path / "run" / LOCAL_SERVER_LOG).exists()


def test_max_tokens_under_the_context_trains(short_model: Path, tmp_path: Path) -> None:
    done = _train(tmp_path / "run", short_model, 8)
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 0, said
    assert "local server: `ludic serve` pid" in said
    assert (tmp_path / "run" / "checkpoints").is_dir()

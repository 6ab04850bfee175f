"""`ludic learner --server-url` without a control token (no `--token`, no $LUDIC_SERVER_TOKEN),
or with one no server can hold (not printable ASCII, surrounding spaces: `ludic serve` refuses
to start with such a token), is refused in one line at once, before it reaches Redis, waits up
to 5 minutes for the server to listen or loads the model; it was refused only after all three.
The check is `ludic train`'s (`server_push_token`), naming the learner's `--token`."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from pipeline_fakes import RedisServer, free_port, ludic_without_torch, redis_server, until

from ludic.pipeline.config import LearnerConfig
from ludic.recipes.inference import server_push_token

pytestmark = pytest.mark.timeout(120)
__all__ = ["redis_server"]
WAITING = "waiting for the inference server at"
MISSING = "ludic learner: error: a server URL needs its control token to push weights: pass --token"
MISSHAPEN = "is not printable ASCII or has surrounding spaces"


@pytest.mark.parametrize(
    ("flag", "env", "refusal"),
    [
        (None, None, MISSING),
        ("", None, MISSING),
        (" s3cr3t", None, f"the control token in --token {MISSHAPEN}"),
        ("s3cr3t-é", None, f"the control token in --token {MISSHAPEN}"),
        (None, "s3cr3t\n", f"the control token in $LUDIC_SERVER_TOKEN {MISSHAPEN}"),
    ],
    ids=["none", "empty", "leading-space", "non-ascii", "env-newline"],
)
def test_a_token_no_server_takes_is_refused_before_redis_and_the_wait(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    flag: str | None,
    env: str | None,
    refusal: str,
) -> None:
    """Nothing listens at --server-url nor at --redis-url, and torch may not be imported: the
    token is the one thing refused, at once."""
    if env is None:
        monkeypatch.delenv("LUDIC_SERVER_TOKEN", raising=False)
    else:
        monkeypatch.setenv("LUDIC_SERVER_TOKEN", env)
    server = f"http://127.0.0.1:{free_port()}"
    redis = f"redis://127.0.0.1:{free_port()}/0"
    token = [] if flag is None else ["--token", flag]
    result = ludic_without_torch(
        "learner",
        *("--server-url", server, "--redis-url", redis, *token),
        *("--steps", "1", "--out-dir", str(tmp_path / "run")),
    )
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("ludic learner: error: "), result.stderr
    assert refusal in errors[0], result.stderr
    assert WAITING not in result.stderr and "redis" not in result.stderr
    assert "Traceback" not in result.stderr
    assert "s3cr3t" not in result.stderr  # the token is not echoed


def test_the_check_names_each_commands_flag_and_passes_a_good_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LUDIC_SERVER_TOKEN", raising=False)
    with pytest.raises(ValueError, match="pass --server-token with the token the server"):
        server_push_token(None)  # `ludic train`'s flag
    with pytest.raises(ValueError, match=r"control token in --token is not printable ASCII"):
        server_push_token("tab\there", flag="--token")
    assert server_push_token("se cret", flag="--token") == "se cret"  # as `ludic serve` takes
    monkeypatch.setenv("LUDIC_SERVER_TOKEN", "from-env")
    assert server_push_token(None, flag="--token") == "from-env"
    assert server_push_token("from-flag", flag="--token") == "from-flag"


@pytest.mark.redis
def test_with_redis_up_the_learner_is_refused_before_it_waits_for_the_server(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """The live case: Redis answers, the server (started just before, say) does not listen
    yet. The learner must not wait 5 minutes for it only to find it has no token to push with."""
    env = {k: v for k, v in os.environ.items() if k != "LUDIC_SERVER_TOKEN"}
    args = ["--server-url", f"http://127.0.0.1:{free_port()}", "--redis-url", redis_server.url]
    learner = subprocess.Popen(
        [sys.executable, "-m", "ludic.cli", "learner", *args, "--steps", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
        cwd=tmp_path,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(learner.stdout or ()), daemon=True)
    reader.start()
    try:  # without the up-front check it says it waits, and waits: stop there
        until(lambda: any(WAITING in line for line in lines) or learner.poll() is not None, "end")
    finally:
        if learner.poll() is None:
            learner.kill()
        learner.wait()
        reader.join(timeout=30)
    output = "".join(lines)
    assert WAITING not in output, output
    assert learner.returncode == 1, output
    errors = [line for line in output.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(MISSING), output


def test_a_learner_without_server_url_needs_no_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --server-url nothing is pushed: no token is asked for, Redis is reached next."""
    from ludic.pipeline import commands

    class ReachedRedis(Exception):
        pass

    def check_reachable(url: str) -> None:
        raise ReachedRedis(url)

    monkeypatch.delenv("LUDIC_SERVER_TOKEN", raising=False)
    monkeypatch.setattr(commands, "check_reachable", check_reachable)
    cfg = LearnerConfig(redis_url="redis://127.0.0.1:1/0", steps=1, out_dir=tmp_path / "run")
    with pytest.raises(ReachedRedis, match=r"redis://127\.0\.0\.1:1/0"):
        commands.run_learner(cfg)

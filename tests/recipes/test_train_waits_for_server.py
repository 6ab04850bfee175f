"""`ludic train --server-url URL` started before its server listens (one script starting
`ludic serve ... &` and then the run) waits for it, saying so, as `ludic actor` and `ludic eval`
do (`wait_for_servers`), then checks --served-model, pushes its starting weights and trains,
instead of failing at once because the server's `/v1/models` did not answer. What needs no
server (the control token) is still refused before any wait, and a host name that does not
resolve fails at once."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from serve_fakes import TOKEN

from app_server import serving_app, tiny_app, until
from ludic.cli import main

pytestmark = pytest.mark.timeout(300)
WAITING = "waiting for the inference server at"
USER_ENV = '''
from ludic.envs import SingleAgentEnv
from ludic.types import StepOutcome


class SayO(SingleAgentEnv):
    """One turn rewarding the share of "o" in the reply."""

    def env_reset(self, seed=None):
        return "Say something.", {}

    def env_step(self, action):
        return StepOutcome(obs="", reward=action.count("o") / max(1, len(action)), terminated=True)
'''
SMALL = ("--steps", "1", "--problems-per-step", "1", "--group-size", "2", "--max-tokens", "4")


@contextmanager
def serving_on(sock: socket.socket) -> Iterator[None]:
    """The embedded HTTP server over the tiny model, with the control token (weight pushes), on
    `sock` (bound all along, so no other test takes its port meanwhile), in a thread."""
    with tiny_app(token=TOKEN) as app, serving_app(app, sock):
        yield


@pytest.mark.slow
@pytest.mark.distributed
def test_train_waits_for_a_server_that_is_not_up_yet(tmp_path: Path) -> None:
    """`ludic train` in a process against a port bound here but not listening yet (connections
    refused); once it says it waits (it ending first fails the test with its output), a server
    starts listening on that very socket."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    (tmp_path / "say_o.py").write_text(USER_ENV)
    args = ["--env", "say_o:SayO", "--server-url", url + "/v1", "--server-token", TOKEN]
    args += ["--max-steps", "1", "--out-dir", str(tmp_path / "run"), "--no-progress", *SMALL]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "COLUMNS": "300"}
    train = subprocess.Popen(
        [sys.executable, "-m", "ludic.cli", "train", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(train.stdout or ()), daemon=True)
    reader.start()
    try:
        until(lambda: any(WAITING in line for line in lines) or train.poll() is not None, "a wait")
        assert train.poll() is None, "ended before its server started:\n" + "".join(lines)
        with serving_on(sock):
            returncode = train.wait(timeout=240)
    finally:
        if train.poll() is None:
            train.kill()
            train.wait()
        reader.join(timeout=30)
        sock.close()
    output = "".join(lines)
    assert returncode == 0, output[-3000:]
    waiting = (
        rf"{WAITING} {re.escape(url)} to listen \(\d+s so far, up to 300s\): a server started "
        "just before is still loading its model"
    )
    assert re.search(waiting, output), output  # 0s, or more on a loaded box
    assert "pushed as policy version 0" in output, output  # the push came after the wait
    steps = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(step)["step"] for step in steps] == [1], steps


@pytest.mark.parametrize(
    ("url", "token", "refusal"),
    [
        (
            "http://127.0.0.1:9/v1",
            None,
            "ludic train: error: a server URL needs its control token to push weights",
        ),
        (
            "http://no-such-host.invalid:8000",
            TOKEN,
            "ludic train: error: cannot reach the inference server at "
            "http://no-such-host.invalid:8000: its host name does not resolve",
        ),
    ],
    ids=["no-token", "unresolvable"],
)
def test_what_waiting_cannot_fix_is_refused_at_once(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    url: str,
    token: str | None,
    refusal: str,
) -> None:
    monkeypatch.delenv("LUDIC_SERVER_TOKEN", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "say_o_refused.py").write_text(USER_ENV)
    flags = ["--server-token", token] if token else []
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "train",
                *("--env", "say_o_refused:SayO", "--server-url", url, *flags),
                *("--out-dir", str(tmp_path / "run"), "--no-progress", *SMALL),
            ],
            report_refusals=True,
        )
    assert exit_info.value.code == 1
    captured = capsys.readouterr()
    assert WAITING not in captured.out  # refused before any wait, not after 5 minutes
    if token is None:  # a flag check: before the model load and the run lock in --out-dir
        assert not (tmp_path / "run").exists(), sorted((tmp_path / "run").iterdir())
    errors = [line for line in captured.err.splitlines() if line.startswith("ludic train:")]
    assert len(errors) == 1 and errors[0].startswith(refusal), captured.err

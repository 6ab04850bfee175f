"""`ludic eval --server-url URL` started before its server listens (one script starting
`ludic serve ... &` and then the evaluation) waits for it, saying so, as `ludic actor` does
(`wait_for_servers`), instead of failing every episode; the --served-model check comes after
the wait, so a wrong name is still refused once the server is up."""

from __future__ import annotations

import io
import re
import socket
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
from rich.console import Console

from app_server import serving_app, tiny_app, until
from ludic.eval.command import EvalConfig, run_eval_command
from ludic.eval.core import EvalResult

pytestmark = pytest.mark.timeout(300)
WAITING = "waiting for the inference server at"


@contextmanager
def serving_on(sock: socket.socket) -> Iterator[None]:
    """The embedded HTTP server over the tiny model, serving it as "tiny", on `sock` (bound
    already, so nothing listened there until now), in a thread."""
    with tiny_app() as app, serving_app(app, sock):
        yield


def eval_before_its_server(
    tmp_path: Path, served_model: str | None
) -> tuple[Future[EvalResult], str, int]:
    """`ludic eval` in a thread against a port where nothing listens yet; once it says it waits
    (it failing first fails the test with its error), the server starts there. Returns the
    finished run, what it printed and the port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused until uvicorn
    port = int(sock.getsockname()[1])
    out = io.StringIO()
    cfg = EvalConfig(
        env="eval_fakes:QuizEnv",
        server_url=f"http://127.0.0.1:{port}/v1",
        served_model=served_model,
        num_problems=2,
        max_steps=1,
        max_tokens=4,
        out_dir=tmp_path / "eval",
        progress=False,
    )
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            run = pool.submit(run_eval_command, cfg, console=Console(file=out, width=200))
            until(lambda: WAITING in out.getvalue() or run.done(), "ludic eval to wait")
            assert not run.done(), f"ended before its server started: {run.exception()!r}"
            with serving_on(sock):
                run.exception(timeout=240)  # finished (its outcome is the test's to read)
    finally:
        sock.close()
    return run, out.getvalue(), port


def test_eval_waits_for_a_server_that_is_not_up_yet(tmp_path: Path) -> None:
    run, output, port = eval_before_its_server(tmp_path, served_model=None)
    result = run.result()
    assert [e.failed for e in result.episodes] == [False, False], result.rollouts
    waiting = rf"{WAITING} http://127\.0\.0\.1:{port} to listen \(\d+s so far, up to 300s\)"
    assert re.search(waiting, output), output  # 0s, or more on a loaded box


def test_a_wrong_served_model_is_refused_once_the_late_server_is_up(tmp_path: Path) -> None:
    run, output, port = eval_before_its_server(tmp_path, served_model="no-such-model")
    with pytest.raises(ValueError) as refused:
        run.result()
    assert WAITING in output
    assert str(refused.value) == (
        f"--served-model no-such-model: the server at http://127.0.0.1:{port}/v1/models serves "
        "tiny, not no-such-model; pass --served-model tiny or leave the flag out"
    )
    assert not (tmp_path / "eval" / "rollouts.jsonl").exists()  # no episode ran

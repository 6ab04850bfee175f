"""A `ludic serve` whose store-driven trainer leaves logs one clear line, not a c10d crash.

A real `ludic serve` (`LocalServer`, its output in a log file) and trainers publishing with
`BroadcastPolicyPublisher(control="store")`: one that closes its publisher, one (a
subprocess) that exits without closing it, one killed with SIGKILL. Each time the server names
the trainer in one line ("... closed its group" / "... went away (its store closed); waiting
for a trainer to join"), prints no `recvValueWithTimeout` warning or C++ frames, frees the
group, stays healthy, and the next trainer joins and pushes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from distributed_fakes import SPEC, nudge_

from ludic.distributed import BroadcastPolicyPublisher
from ludic.inference.http.local_server import LocalServer
from ludic.models import load_model, tiny_model_dir

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(240)]
TOKEN = "exit-log-token"
WAITING = "; waiting for a trainer to join"
SPAM = ("recvValueWithTimeout", "frame #", "Did the remote server shutdown or crash?")

TRAINER = """
import os, signal, sys
import torch
from ludic.distributed import BroadcastPolicyPublisher
from ludic.models import load_model
url, token, model_dir, version, how = sys.argv[1:6]
model, _ = load_model(model_dir, dtype=torch.float32)
publisher = BroadcastPolicyPublisher(url, token, control="store", bucket_mb=0.02, timeout_s=60)
publisher.publish(model, version=int(version))
print(publisher.fleet.store.port, flush=True)
if how == "kill":
    sys.stdin.readline()  # the test sends SIGKILL meanwhile
# how == "exit": the process ends without publisher.close()
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with LocalServer(tiny_model_dir(spec=SPEC), token=TOKEN, log_path=log) as srv:
        yield srv


def _get(server: LocalServer, path: str) -> dict[str, object]:
    reply = httpx.get(server.url + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    reply.raise_for_status()
    result: dict[str, object] = reply.json()
    return result


def _new_log(server: LocalServer, seen: int) -> str:
    return server.log_path.read_text(errors="replace")[seen:]


def _wait_for_line(server: LocalServer, seen: int, needle: str, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while needle not in (text := _new_log(server, seen)):
        assert time.monotonic() < deadline, f"no {needle!r} in the server log:\n{text[-3000:]}"
        time.sleep(0.1)
    time.sleep(0.5)  # anything printed right after the line (a stack trace) lands too
    return _new_log(server, seen)


def _assert_one_clear_line(text: str, line: str) -> None:
    assert text.count(WAITING) == 1 and line in text, text
    assert not any(noise in text for noise in SPAM), f"c10d noise in the server log:\n{text}"


def _assert_free_and_serving(server: LocalServer, version: int) -> None:
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    status = _get(server, "/ludic/weights/status")
    assert not status["connected"] and status["store"] is None  # the group was freed
    assert _get(server, "/ludic/version")["policy_version"] == version


def _push_from_a_new_trainer(server: LocalServer, version: int) -> None:
    model, _ = load_model(tiny_model_dir(spec=SPEC), dtype=torch.float32)
    nudge_(model, 0.01 * version)
    publisher = BroadcastPolicyPublisher(
        server.url, TOKEN, control="store", bucket_mb=0.02, timeout_s=60
    )
    publisher.publish(model, version=version)
    assert _get(server, "/ludic/version")["policy_version"] == version
    seen = len(server.log_path.read_text(errors="replace"))
    port = publisher.fleet.store.port
    publisher.close()
    text = _wait_for_line(server, seen, WAITING)
    _assert_one_clear_line(text, f"weight-sync trainer at 127.0.0.1:{port} closed its group")


def test_a_closed_publisher_leaves_one_clear_line(server: LocalServer) -> None:
    _push_from_a_new_trainer(server, version=1)
    _assert_free_and_serving(server, version=1)
    assert _get(server, "/ludic/weights/status")["last_error"] is None  # a normal end


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_trainer_that_leaves_without_closing_is_named_in_one_line(
    server: LocalServer, tmp_path: Path, how: str
) -> None:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    version = 10 if how == "exit" else 20
    seen = len(server.log_path.read_text(errors="replace"))
    model_dir = str(tiny_model_dir(spec=SPEC))
    trainer = subprocess.Popen(
        [sys.executable, str(script), server.url, TOKEN, model_dir, str(version), how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        assert trainer.stdout is not None
        port = trainer.stdout.readline().strip()
        assert port.isdigit(), f"the trainer did not publish (exit {trainer.poll()})"
        assert _get(server, "/ludic/weights/status")["connected"]
    finally:
        if how == "kill":
            trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=60)
    text = _wait_for_line(server, seen, WAITING)
    _assert_one_clear_line(
        text, f"weight-sync trainer at 127.0.0.1:{port} went away (its store closed)" + WAITING
    )
    _assert_free_and_serving(server, version=version)
    assert "lost the trainer's store" in str(_get(server, "/ludic/weights/status")["last_error"])
    _push_from_a_new_trainer(server, version=version + 1)  # the next trainer joins and pushes

"""`openenv:URL` is checked reachable when the env spec is resolved: a server that is down (a
closed port here) is refused in one line naming the URL and the connection error, by `ludic
train` before the model loads, instead of failing every episode's reset once the run started."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ludic.envs.registry import adapter_spec
from ludic.errors import is_refusal

pytest.importorskip("openenv.core", reason="needs openenv-core: pip install 'ludic[openenv]'")

from ludic.envs.adapters.openenv import OpenEnvUnreachableError, check_reachable


@pytest.fixture
def closed_url() -> str:
    with socket.socket() as s:  # a port nothing listens on once this socket is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def listening_url() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"ws://127.0.0.1:{s.getsockname()[1]}"


def test_a_closed_port_is_refused_naming_the_url_and_the_error(closed_url: str) -> None:
    with pytest.raises(OpenEnvUnreachableError) as caught:
        adapter_spec(f"openenv:{closed_url}")
    message = str(caught.value)
    assert message.startswith(f"openenv:{closed_url}: cannot reach the OpenEnv server at ")
    assert "ConnectionRefusedError" in message and "start the server, or fix the URL" in message
    assert "\n" not in message and is_refusal(caught.value)


def test_a_listening_server_resolves(listening_url: str) -> None:
    check_reachable(listening_url)
    spec = adapter_spec(f"openenv:{listening_url}")
    assert spec is not None and spec.name == f"openenv:{listening_url}"


def test_a_url_without_host_or_with_a_bad_port_is_refused() -> None:
    with pytest.raises(ValueError, match="names no host"):
        check_reachable("http://:8000")
    with pytest.raises(ValueError, match=r"openenv:http://localhost:port: .*HOST:PORT"):
        check_reachable("http://localhost:port")


def test_ludic_train_refuses_it_in_one_line_before_the_model_loads(
    closed_url: str, tmp_path: Path
) -> None:
    out_dir = tmp_path / "run"
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "HF_HUB_OFFLINE": "1"}
    environ.pop("LUDIC_TRACEBACK", None)
    command = ["train", "--env", f"openenv:{closed_url}", "--out-dir", str(out_dir)]
    done = subprocess.run(
        [sys.executable, "-m", "ludic.cli", *command],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert f"ludic train: error: openenv:{closed_url}: cannot reach" in done.stderr
    assert "Traceback" not in done.stderr
    assert not out_dir.exists()  # refused before the run directory, the model and episodes

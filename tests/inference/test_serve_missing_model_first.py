"""`ludic serve --model /nope` on a port in use said "port ... is in use" first; a user who frees
the port only then learns the model is not there. The model directory (config.json, no weights
read) is checked before the port."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from ludic.cli import EXIT_REFUSED, main


def test_a_missing_model_is_named_before_a_port_in_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as exit_:
            main(["serve", "--model", str(missing), "--port", str(port)], report_refusals=True)
    assert exit_.value.code == EXIT_REFUSED
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"ludic serve: error: no model directory at {missing}"), first
    assert "in use" not in first

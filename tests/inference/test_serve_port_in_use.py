"""`ludic serve` on a port another process listens on is refused before the model loads, as one
`ludic serve: error: port HOST:PORT is in use ...` line and exit code 1 (uvicorn alone would find
out after loading the model and printing the server's address, and exit with 3)."""

from __future__ import annotations

import socket

import pytest

from ludic.cli import EXIT_REFUSED, main
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.models import tiny_model_dir


def test_a_port_in_use_is_refused_before_the_model_loads(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model loaded before the port was checked")

    monkeypatch.setattr(EmbeddedEngine, "from_pretrained", load)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as exit_:
            main(
                ["serve", "--model", str(tiny_model_dir()), "--port", str(port)],
                report_refusals=True,
            )
    assert exit_.value.code == EXIT_REFUSED
    out, err = capsys.readouterr()
    assert out == ""
    first = err.splitlines()[0]
    assert first.startswith(f"ludic serve: error: port 127.0.0.1:{port} is in use"), err
    assert "--port" in first
    assert "address already in use" in first.lower()  # what LocalServer looks for in its log

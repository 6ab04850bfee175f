"""Fixtures shared by the weight-sync tests that push to a real server process: one embedded
server (weight-sync routes) for the whole session, and a fresh tiny model per test. Each test
starts its own trainers, so it replaces whatever group an earlier test left on the server;
none relies on the server being new, so the server is not restarted per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from distributed_fakes import SPEC, ServerProcess, start_weight_server

from ludic.models import load_model, tiny_model_dir


@pytest.fixture(scope="session")
def weight_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`weight_server_main.py` serving the `SPEC` model on a free port (log in a temp dir)."""
    log = tmp_path_factory.mktemp("weight-server") / "server.log"
    server = start_weight_server(tiny_model_dir(spec=SPEC), log)
    yield server
    server.stop()


@pytest.fixture()
def model() -> torch.nn.Module:
    """The `SPEC` model as the server loaded it (tests nudge it in place: one per test)."""
    loaded, _ = load_model(tiny_model_dir(spec=SPEC), dtype=torch.float32)
    return loaded

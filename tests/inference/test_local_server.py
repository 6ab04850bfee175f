"""LocalServer: `ludic serve` in a child process answers completions with the token it was
given (never on the command line), stops on close, and says why when it cannot start."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from ludic.inference import ChatRequest, SamplingConfig
from ludic.inference.http.local_server import LocalServer
from ludic.inference.http.openai_client import OpenAICompatibleClient
from ludic.models import tiny_model_dir


def test_a_folder_without_a_model_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"not a model directory.*save_model"):
        LocalServer(tmp_path)
    with pytest.raises(ValueError, match="threads must be >= 1"):
        LocalServer(tiny_model_dir(), threads=0)


def test_url_before_start_says_to_start_it() -> None:
    with pytest.raises(RuntimeError, match="not running"):
        _ = LocalServer(tiny_model_dir()).url


@pytest.mark.slow
def test_a_server_that_cannot_start_fails_with_its_log(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    server = LocalServer(tmp_path, startup_timeout_s=120)
    with pytest.raises(RuntimeError, match="exited with code") as caught:
        server.start()
    assert "no-such-architecture" in str(caught.value)  # the child's own error, from its log
    assert server.process is None
    assert not server.log_path.exists()  # its own temporary log is gone once closed


@pytest.mark.slow
def test_serves_completions_and_weight_control_with_its_token_then_stops() -> None:
    with LocalServer(tiny_model_dir(), threads=1, served_model_name="tiny") as server:
        process = server.process
        assert process is not None
        assert server.token not in " ".join(map(str, process.args))  # not visible in `ps`
        models = httpx.get(server.url + "/v1/models", timeout=30).json()
        assert [card["id"] for card in models["data"]] == ["tiny"]
        auth = {"Authorization": f"Bearer {server.token}"}
        assert httpx.get(server.url + "/ludic/version", headers=auth, timeout=30).json() == {
            "policy_version": 0
        }
        wrong = {"Authorization": "Bearer wrong"}
        assert httpx.get(server.url + "/ludic/version", headers=wrong, timeout=30).is_error

        async def ask() -> list[int]:
            client = OpenAICompatibleClient(server.url, model="tiny")
            try:
                request = ChatRequest(
                    messages=[{"role": "user", "content": "hi"}],
                    sampling=SamplingConfig(max_tokens=5, extras={"ignore_eos": True}),
                )
                return list((await client.complete(request)).completion_token_ids)
            finally:
                await client.aclose()

        assert len(asyncio.run(ask())) == 5
    assert process.poll() is not None  # stopped when the block ended
    server.close()  # twice is fine

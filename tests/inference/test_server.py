"""The embedded server in a subprocess on 127.0.0.1, driven over real HTTP by the client."""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import save

from ludic.distributed import BroadcastPolicyPublisher
from ludic.inference import ChatRequest, SamplingConfig
from ludic.inference.engine import EmbeddedEngine
from ludic.inference.openai_client import InferenceRequestError, OpenAICompatibleClient
from ludic.models import load_model, load_tiny_model, tiny_model_dir

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
USER = [{"role": "user", "content": "Your move."}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_server(model_dir: Path, log: Path, port: int | None = None) -> Server:
    port = port or free_port()
    cmd = [
        sys.executable,
        "-m",
        "ludic.inference.server",
        "--model",
        str(model_dir),
        "--port",
        str(port),
    ]
    cmd += ["--token", TOKEN, "--threads", "1", "--served-model-name", "tiny"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with log.open("ab") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = Server(url=f"http://127.0.0.1:{port}", port=port, process=process, log=log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"server exited with {process.returncode}:\n{log.read_text()[-3000:]}"
            )
        try:
            if httpx.get(server.url + "/health", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"server did not become healthy:\n{log.read_text()[-3000:]}")


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tiny_model_dir(), tmp_path_factory.mktemp("server") / "server.log")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def local_engine() -> Iterator[EmbeddedEngine]:
    model, tokenizer = load_tiny_model()
    with EmbeddedEngine(model, tokenizer) as engine:
        yield engine


async def test_chat_over_http_matches_in_process(
    server: Server, local_engine: EmbeddedEngine
) -> None:
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    request = ChatRequest(
        messages=USER, sampling=SamplingConfig(max_tokens=10, seed=11), tools=tools
    )
    async with OpenAICompatibleClient(server.url + "/v1", "tiny", timeout=60) as client:
        remote = await client.complete(request)
    local = await local_engine.complete(request)
    assert remote.prompt_token_ids == local.prompt_token_ids
    assert remote.completion_token_ids == local.completion_token_ids
    assert remote.text == local.text and remote.finish_reason == local.finish_reason == "length"
    assert remote.policy_version == 0
    assert torch.allclose(
        torch.tensor(remote.completion_logprobs), torch.tensor(local.completion_logprobs), atol=1e-4
    )


async def test_token_in_over_http_matches_in_process(
    server: Server, local_engine: EmbeddedEngine
) -> None:
    ids = local_engine.tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    request = ChatRequest(
        messages=[], prompt_token_ids=ids, sampling=SamplingConfig(max_tokens=8, seed=2)
    )
    async with OpenAICompatibleClient(server.url, "tiny", timeout=60) as client:
        remote = await client.complete(request)
    local = await local_engine.complete(request)
    assert remote.prompt_token_ids == tuple(ids) == local.prompt_token_ids
    assert remote.completion_token_ids == local.completion_token_ids
    assert torch.allclose(
        torch.tensor(remote.completion_logprobs), torch.tensor(local.completion_logprobs), atol=1e-4
    )


def test_health_models_and_raw_response_fields(server: Server) -> None:
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok" and health["running"] is True
    models = httpx.get(server.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    body = {
        "model": "tiny",
        "messages": USER,
        "max_tokens": 3,
        "logprobs": True,
        "return_token_ids": True,
    }
    reply = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    choice = reply["choices"][0]
    assert len(choice["token_ids"]) == 3 and len(choice["logprobs"]["content"]) == 3
    assert {"token", "logprob", "bytes", "top_logprobs"} <= set(choice["logprobs"]["content"][0])
    assert reply["prompt_token_ids"] and reply["usage"]["completion_tokens"] == 3
    plain = httpx.post(
        server.url + "/v1/chat/completions", json={"messages": USER, "max_tokens": 2}, timeout=60
    ).json()
    assert "token_ids" not in plain["choices"][0] and plain["choices"][0]["logprobs"] is None


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v1/chat/completions", {"messages": USER, "n": 2}, 400, "n=2 is not supported"),
        ("/v1/chat/completions", {"messages": [], "stream": True}, 400, "at least one message"),
        ("/v1/completions", {"prompt": [10**8], "stream": True}, 400, "outside the vocabulary"),
        ("/v1/completions", {"prompt": [1], "stream_options": {}}, 400, "stream=true"),
        ("/v1/chat/completions", {"messages": USER, "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/chat/completions", {"messages": USER, "temperature": -1}, 400, "temperature"),
        ("/v1/chat/completions", {"max_tokens": 2}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [], "max_tokens": 2}, 400, "at least one message"),
        ("/v1/chat/completions", {"model": "gpt-9", "messages": USER}, 404, "gpt-9"),
        ("/v1/completions", {"prompt": [10**8], "max_tokens": 2}, 400, "outside the vocabulary"),
        ("/v1/completions", {"prompt": [1, 2], "max_tokens": 2, "top_p": 0}, 400, "top_p"),
    ],
)
def test_invalid_requests_get_4xx_with_a_message(
    server: Server, path: str, body: dict[str, object], status: int, message: str
) -> None:
    reply = httpx.post(server.url + path, json=body, timeout=60)
    assert reply.status_code == status
    assert message in reply.json()["error"]["message"]


def sse_chunks(url: str, body: dict[str, object]) -> list[dict[str, Any]]:
    """POST a streaming request; its chunks, after checking the event framing and [DONE]."""
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        events = [line for line in reply.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    return [json.loads(e.removeprefix("data: ")) for e in events[:-1]]


def test_streamed_chat_adds_up_to_the_unstreamed_reply(server: Server) -> None:
    url = server.url + "/v1/chat/completions"
    body = {
        "messages": USER,
        "max_tokens": 40,
        "seed": 4,
        "stop": ["e"],
        "logprobs": True,
        "return_token_ids": True,
    }
    whole = httpx.post(url, json=body, timeout=60).json()
    chunks = sse_chunks(url, {**body, "stream_options": {"include_usage": True}})
    *deltas, usage = chunks
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len(deltas) > 1
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]
    choices = [c["choices"][0] for c in deltas]
    assert choices[0]["delta"]["role"] == "assistant"
    assert deltas[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    (want,) = whole["choices"]
    assert "".join(c["delta"]["content"] for c in choices) == want["message"]["content"]
    assert [t for c in choices for t in c["token_ids"]] == want["token_ids"]
    streamed_logprobs = [t for c in choices if c["logprobs"] for t in c["logprobs"]["content"]]
    assert streamed_logprobs == want["logprobs"]["content"]
    assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + ["stop"]
    assert choices[-1]["stop_reason"] == want["stop_reason"] == "e"
    assert deltas[-1]["policy_version"] == 0


def test_streamed_token_in_completion_adds_up_to_the_unstreamed_reply(server: Server) -> None:
    url = server.url + "/v1/completions"
    body = {"prompt": [5, 6, 7], "max_tokens": 12, "seed": 9, "logprobs": 0}
    whole = httpx.post(url, json={**body, "return_token_ids": True}, timeout=60).json()
    choices = [c["choices"][0] for c in sse_chunks(url, body)]
    (want,) = whole["choices"]
    assert "".join(c["text"] for c in choices) == want["text"]
    for field in ("token_logprobs", "tokens", "text_offset"):
        streamed = [x for c in choices if c["logprobs"] for x in c["logprobs"][field]]
        assert streamed == want["logprobs"][field]
    assert choices[-1]["finish_reason"] == "length" and "token_ids" not in choices[0]


def test_a_client_leaving_a_stream_cancels_its_request(server: Server) -> None:
    body = {"messages": USER, "max_tokens": 1500, "ignore_eos": True, "stream": True}
    url = server.url + "/v1/chat/completions"
    cancelled = httpx.get(server.url + "/health").json()["cancelled"]
    with httpx.stream("POST", url, json=body, timeout=60) as reply:
        next(reply.iter_lines())  # generation has started
    deadline = time.monotonic() + 60  # a request run to its end is not counted as cancelled
    while (health := httpx.get(server.url + "/health").json())["cancelled"] == cancelled:
        assert time.monotonic() < deadline, "the abandoned request was not cancelled"
        time.sleep(0.05)
    assert health["cancelled"] == cancelled + 1


async def test_client_raises_the_servers_4xx_message(server: Server) -> None:
    async with OpenAICompatibleClient(server.url, "tiny") as client:
        with pytest.raises(InferenceRequestError, match="outside the vocabulary"):
            await client.complete(ChatRequest(messages=[], prompt_token_ids=[10**8]))


def test_control_endpoints_need_the_token(server: Server) -> None:
    assert httpx.get(server.url + "/ludic/version").status_code == 401
    assert (
        httpx.get(
            server.url + "/ludic/version", headers={"Authorization": "Bearer nope"}
        ).status_code
        == 401
    )
    assert httpx.post(server.url + "/ludic/update_weights", content=b"x").status_code == 401
    assert httpx.get(server.url + "/ludic/version", headers=AUTH).json() == {"policy_version": 0}
    bad = httpx.post(server.url + "/ludic/update_weights", content=b"not safetensors", headers=AUTH)
    assert bad.status_code == 400 and "safetensors" in bad.json()["error"]["message"]


def _probe(url: str, ids: list[int]) -> list[float]:
    reply = httpx.post(url + "/ludic/logprobs", json={"token_ids": ids}, headers=AUTH, timeout=60)
    assert reply.status_code == 200, reply.text
    return list(reply.json()["logprobs"])


def test_weight_updates_change_outputs_and_bump_the_version(tmp_path: Path) -> None:
    """Own server: safetensors over HTTP, then a gloo broadcast through /ludic/weights/*."""
    srv = start_server(tiny_model_dir(), tmp_path / "server.log")
    try:
        body = {"messages": USER, "max_tokens": 6, "temperature": 0, "return_token_ids": True}
        before = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60).json()
        probe = before["prompt_token_ids"] + before["choices"][0]["token_ids"]
        seed1, _ = load_tiny_model(seed=1)
        payload = io.BytesIO(
            save({k: v.contiguous() for k, v in seed1.state_dict().items()})
        ).getvalue()
        reply = httpx.post(
            srv.url + "/ludic/update_weights", content=payload, headers=AUTH, timeout=60
        )
        assert reply.json() == {"policy_version": 1}
        after = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60).json()
        assert after["policy_version"] == 1
        assert after["choices"][0]["token_ids"] != before["choices"][0]["token_ids"]
        assert torch.allclose(
            torch.tensor(_probe(srv.url, probe)),
            torch.tensor(_local_probe(seed1, probe)),
            atol=1e-4,
        )

        seed2, _ = load_tiny_model(seed=2)
        publisher = BroadcastPolicyPublisher(srv.url, TOKEN, timeout_s=60)  # verifies by probe
        publisher.publish(seed2, version=7)
        publisher.close()
        assert httpx.get(srv.url + "/ludic/version", headers=AUTH).json() == {"policy_version": 7}
        assert torch.allclose(
            torch.tensor(_probe(srv.url, probe)),
            torch.tensor(_local_probe(seed2, probe)),
            atol=1e-4,
        )
    finally:
        srv.stop()


def _local_probe(model: torch.nn.Module, ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return (
        torch.log_softmax(logits, -1)
        .gather(-1, torch.tensor(ids[1:])[:, None])
        .squeeze(-1)
        .tolist()
    )


async def test_client_recovers_when_the_server_restarts_mid_request(tmp_path: Path) -> None:
    model_dir = tiny_model_dir()
    srv = start_server(model_dir, tmp_path / "server.log")
    sampling = SamplingConfig(max_tokens=200, seed=5, extras={"ignore_eos": True})
    request = ChatRequest(messages=USER, sampling=sampling)
    client = OpenAICompatibleClient(
        srv.url, "tiny", timeout=120, max_retries=8, backoff_s=0.5, max_backoff_s=4
    )
    try:
        pending = asyncio.create_task(client.complete(request))
        while httpx.get(srv.url + "/health").json()["active"] == 0:  # the request is being decoded
            assert not pending.done(), "finished before the restart; raise max_tokens"
            await asyncio.sleep(0.02)
        srv.stop()
        srv = await asyncio.to_thread(start_server, model_dir, tmp_path / "server.log", srv.port)
        response = await pending
        assert response.finish_reason == "length" and len(response.completion_token_ids) == 200
        model, tokenizer = load_model(model_dir)
        with EmbeddedEngine(model, tokenizer) as engine:
            assert (
                await engine.complete(request)
            ).completion_token_ids == response.completion_token_ids
    finally:
        await client.aclose()
        srv.stop()


def test_a_step_failing_mid_stream_ends_it_with_an_error_event() -> None:
    from fastapi.testclient import TestClient

    from ludic.inference.server import create_app

    model, tokenizer = load_tiny_model()
    with EmbeddedEngine(model, tokenizer) as engine:
        real_step = engine._batch.step

        def failing_step() -> list[Any]:  # fails the request, in a batch or alone, at 3 tokens
            if any(len(row.completion_ids) >= 3 for row in engine._batch.rows):
                raise RuntimeError("simulated out of memory")
            return real_step()

        engine._batch.step = failing_step  # type: ignore[method-assign]
        body = {
            "messages": USER,
            "max_tokens": 50,
            "ignore_eos": True,
            "stream": True,
            "return_token_ids": True,
        }
        with TestClient(create_app(engine, model_name="tiny")) as client:
            with client.stream("POST", "/v1/chat/completions", json=body) as reply:
                events = [line for line in reply.iter_lines() if line]
            assert reply.status_code == 200  # the stream had started
            assert events[-1] == "data: [DONE]"
            error = json.loads(events[-2].removeprefix("data: "))["error"]
            assert "simulated out of memory" in error["message"] and error["code"] == 500
            chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
            assert sum(len(c["choices"][0]["token_ids"]) for c in chunks) >= 2  # before failing
            engine._batch.step = real_step  # type: ignore[method-assign]
            after = client.post("/v1/chat/completions", json={**body, "stream": False})
            assert after.status_code == 200  # one failed request, not a failed server

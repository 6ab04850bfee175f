"""The embedded server in a subprocess on 127.0.0.1, driven over real HTTP by the client."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import threading
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
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.auth import TOKEN_ENV
from ludic.inference.http.openai_client import InferenceRequestError, OpenAICompatibleClient
from ludic.models import load_model, load_tiny_model, tiny_model_dir
from ludic.training.collate import CollatedBatch, TokenSampling
from ludic.training.logprobs import sequence_logprobs

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


def start_server(
    model_dir: Path,
    log: Path,
    port: int | None = None,
    *,
    token_in_env: bool = False,
    args: tuple[str, ...] = (),
) -> Server:
    """`ludic serve` in a subprocess; the token on the command line, or (`token_in_env`) in
    $LUDIC_SERVER_TOKEN only, where `ps` does not show it."""
    port = port or free_port()
    cmd = [
        sys.executable,
        "-m",
        "ludic.inference.http.server",
        "--model",
        str(model_dir),
        "--port",
        str(port),
    ]
    cmd += ["--threads", "1", "--served-model-name", "tiny", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop(TOKEN_ENV, None)
    if token_in_env:
        env[TOKEN_ENV] = TOKEN
    else:
        cmd += ["--token", TOKEN]
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
    log = tmp_path_factory.mktemp("server") / "server.log"
    srv = start_server(tiny_model_dir(), log, token_in_env=True)
    assert not any(TOKEN in arg for arg in srv.process.args)  # type: ignore[union-attr]
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


def test_the_server_says_where_it_serves(server: Server) -> None:
    """`ludic serve` printed only "Loading weights": which model, device, URL and whether its
    control endpoints are on is the first thing its user needs."""
    line = next(x for x in server.log.read_text().splitlines() if x.startswith("ludic serve:"))
    assert "as 'tiny' on cpu (torch.float32)" in line
    assert f"http://127.0.0.1:{server.port}/v1" in line and "need the token" in line
    assert line.endswith(
        "engine: default kernels"
    )  # or the --batch-invariant/--prepacked-gemm flags


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
        ("/v1/completions", {"prompt": [1, 2], "top_k": 2**63}, 400, "top_k must be in"),
        ("/v1/completions", {"prompt": [1, 2], "seed": 2**64}, 400, "seed must be in"),
        ("/v1/completions", {"prompt": [1, 2], "top_p": 1.5}, 400, "top_p must be in (0, 1]"),
        ("/v1/chat/completions", {"messages": USER, "max_tokens": 4096}, 400, "max_tokens=4096"),
        ("/v1/chat/completions", {"messages": USER, "stop": ["x"] * 65}, 400, "stop holds 65"),
        ("/v1/completions", {"prompt": [1] * 3000}, 400, "the prompt has 3000 tokens"),
        (
            "/v1/chat/completions",
            {"messages": USER, "chat_template_kwargs": {"chat_template": "{{ 1 }}"}},
            400,
            "chat_template_kwargs may not set",
        ),
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


def test_a_bearer_token_of_any_characters_is_a_mismatch_not_an_error(server: Server) -> None:
    non_ascii = {"Authorization": "Bearer tökén".encode()}
    for path in ("/ludic/version", "/ludic/weights/status"):
        reply = httpx.get(server.url + path, headers=non_ascii, timeout=60)
        assert reply.status_code == 401, (path, reply.text)


def test_the_logprob_probe_is_capped_at_the_context(server: Server) -> None:
    body = {"token_ids": [1] * 5000}
    reply = httpx.post(server.url + "/ludic/logprobs", json=body, headers=AUTH, timeout=60)
    assert reply.status_code == 400
    assert "at most 2048 token ids" in reply.json()["error"]["message"]


def test_a_nan_temperature_is_a_400(server: Server) -> None:
    body = b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'
    reply = httpx.post(
        server.url + "/v1/chat/completions",
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert reply.status_code == 400
    assert "temperature must be a finite number" in reply.json()["error"]["message"]


async def test_a_top_k_of_2_63_among_ten_good_requests_fails_alone(server: Server) -> None:
    url = server.url + "/v1/chat/completions"
    good = [{"messages": USER, "max_tokens": 8, "seed": k, "ignore_eos": True} for k in range(10)]
    async with httpx.AsyncClient(timeout=120) as client:
        replies = await asyncio.gather(
            *(client.post(url, json=b) for b in good[:5]),
            client.post(url, json={"messages": USER, "top_k": 2**63}),
            *(client.post(url, json=b) for b in good[5:]),
        )
    assert [r.status_code for r in replies] == [200] * 5 + [400] + [200] * 5
    assert "top_k" in replies[5].json()["error"]["message"]


def test_request_bodies_are_capped(server: Server) -> None:
    url = server.url + "/v1/chat/completions"
    text = "x" * (9 * 2**20)  # over the default 8 MiB
    reply = httpx.post(url, json={"messages": [{"role": "user", "content": text}]}, timeout=60)
    assert reply.status_code == 413
    assert "--max-body-bytes" in reply.json()["error"]["message"]
    chunks = [b'{"messages": [{"role": "user", "content": "', text.encode(), b'"}]}']
    unsized = httpx.post(url, content=iter(chunks), timeout=60)  # chunked: no Content-Length
    assert unsized.status_code == 413
    assert httpx.get(server.url + "/health", timeout=60).status_code == 200


def test_the_body_cap_is_configurable_and_spares_the_weight_upload() -> None:
    from fastapi.testclient import TestClient

    from ludic.inference.http.server import create_app

    model, tokenizer = load_tiny_model()
    with EmbeddedEngine(model, tokenizer) as engine:
        app = create_app(engine, model_name="tiny", token=TOKEN, max_body_bytes=1000)
        with TestClient(app) as client:
            body = {"messages": USER, "max_tokens": 2}
            assert client.post("/v1/chat/completions", json=body).status_code == 200
            padded = {**body, "pad": "x" * 1000}
            reply = client.post("/v1/chat/completions", json=padded)
            assert reply.status_code == 413 and "over 1000 bytes" in reply.text
            weights = client.post("/ludic/update_weights", content=b"x" * 5000, headers=AUTH)
            assert weights.status_code == 400 and "safetensors" in weights.text  # read, not 413
        with pytest.raises(ValueError, match="max_body_bytes"):
            create_app(engine, model_name="tiny", max_body_bytes=0)


@contextlib.contextmanager
def serving_in_thread(app: Any) -> Iterator[str]:
    """Serve `app` with uvicorn on a thread of this process (so a test can inject faults)."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-loop", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


BAD_MARK = "<bad-request>"


async def test_one_bad_request_among_ten_good_ones_over_http(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fault inside the shared step for one request (injected where its sampled token is
    recorded): that request gets a 500 naming the fault, the ten others their own tokens."""
    from ludic.inference.embedded.sequence import SequenceState
    from ludic.inference.http.server import create_app

    model, tokenizer = load_tiny_model()
    good = [
        {"messages": USER, "max_tokens": 8, "seed": k, "ignore_eos": True, "return_token_ids": True}
        for k in range(10)
    ]
    bad = {"messages": USER, "max_tokens": 8, "stop": [BAD_MARK], "ignore_eos": True}
    append = SequenceState.append

    def record(self: SequenceState, *args: Any, **kwargs: Any) -> None:
        if BAD_MARK in self.stop:
            raise RuntimeError("injected fault")
        append(self, *args, **kwargs)

    with (
        EmbeddedEngine(model, tokenizer) as engine,
        serving_in_thread(create_app(engine, model_name="tiny")) as url,
    ):
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            path = "/v1/chat/completions"
            reference = [(await client.post(path, json=b)).json() for b in good]
            monkeypatch.setattr(SequenceState, "append", record)
            bodies = [*good[:5], bad, *good[5:]]
            replies = await admitted_together(engine, [client.post(path, json=b) for b in bodies])
    failed = replies.pop(5)
    assert failed.status_code == 500 and "injected fault" in failed.json()["error"]["message"]
    assert [r.status_code for r in replies] == [200] * 10
    for want, got in zip(reference, replies, strict=True):
        assert got.json()["choices"][0]["token_ids"] == want["choices"][0]["token_ids"]


async def admitted_together(engine: EmbeddedEngine, posts: list[Any]) -> list[Any]:
    """Run the `posts` (coroutines) with the engine's worker held until all are queued, so
    that they share one batch."""
    entered, gate = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        gate.wait()

    held = asyncio.get_running_loop().run_in_executor(None, engine._call_on_worker, hold)
    await asyncio.to_thread(entered.wait, 60)
    tasks = [asyncio.ensure_future(p) for p in posts]
    while len(engine._pending) < len(posts):
        await asyncio.sleep(0.01)
    gate.set()
    await held
    return list(await asyncio.gather(*tasks))


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": USER, "max_tokens": 2}),
        ("/v1/completions", {"prompt": "a long text prompt", "max_tokens": 2}),
    ],
)
def test_health_answers_while_a_prompt_is_tokenized(
    monkeypatch: pytest.MonkeyPatch, path: str, body: dict[str, Any]
) -> None:
    """The request's tokenizing is held until /health has answered: were it on the event loop,
    /health could not answer (the bound is a guard against hanging, not a speed check)."""
    from ludic.inference.http.server import create_app

    model, tokenizer = load_tiny_model()
    encode, threads = tokenizer.encode, []
    started, release = threading.Event(), threading.Event()

    def held_encode(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        started.set()
        release.wait(60)
        return encode(*args, **kwargs)

    with EmbeddedEngine(model, tokenizer) as engine:
        monkeypatch.setattr(tokenizer, "encode", held_encode)
        with serving_in_thread(create_app(engine, model_name="tiny")) as url:
            replies: list[httpx.Response] = []
            request = threading.Thread(
                target=lambda: replies.append(httpx.post(url + path, json=body, timeout=120))
            )
            request.start()
            assert started.wait(60)
            health = httpx.get(url + "/health", timeout=30)
            release.set()
            request.join(120)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert replies[0].status_code == 200, replies[0].text
    assert threads and "uvicorn-loop" not in threads


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
    # The retries (jittered, 0.25-4 s apart: over 123 s in all) outlast start_server's own
    # 120 s deadline. 8 retries gave up after 12-24 s, while a `ludic serve` start took 20-24 s
    # on a loaded 2-core machine (measured): the client gave up on a restart in progress.
    client = OpenAICompatibleClient(
        srv.url, "tiny", timeout=120, max_retries=64, backoff_s=0.5, max_backoff_s=4
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

    from ludic.inference.http.server import create_app

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


def _trainer_batch(responses: list[Any], temperature: float, top_p: float) -> CollatedBatch:
    """Each response's prompt + completion as a right-padded row, its completion sampled at
    (temperature, top_p)."""
    rows = [[*r.prompt_token_ids, *r.completion_token_ids] for r in responses]
    B, T = len(rows), max(map(len, rows))
    ids_BT, mask_BT = torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, dtype=torch.long)
    temperature_BT, top_p_BT = torch.ones(B, T), torch.ones(B, T)
    for b, row in enumerate(rows):
        ids_BT[b, : len(row)], mask_BT[b, : len(row)] = torch.tensor(row), 1
        temperature_BT[b, len(responses[b].prompt_token_ids) : len(row)] = temperature
        top_p_BT[b, len(responses[b].prompt_token_ids) : len(row)] = top_p
    sampling = TokenSampling(
        temperature_BT=temperature_BT, top_k_BT=torch.full((B, T), -1), top_p_BT=top_p_BT
    )
    return CollatedBatch(
        input_ids_BT=ids_BT,
        attention_mask_BT=mask_BT,
        action_mask_BT=mask_BT.float(),
        advantages_B=torch.zeros(B),
        sampling=sampling,
    )


@pytest.mark.slow
async def test_batch_invariant_serve_gives_alone_bits_and_the_trainers_logprobs(
    tmp_path: Path,
) -> None:
    """`ludic serve --batch-invariant`: requests served together get the tokens and logprobs
    they get alone, and the trainer's batch-invariant recomputation gives the served logprobs
    back bit for bit (ratio exactly 1 over HTTP)."""
    srv = start_server(tiny_model_dir(), tmp_path / "server.log", args=("--batch-invariant",))
    try:
        requests = [
            ChatRequest(
                messages=[{"role": "user", "content": "Your move. " + "X O " * i}],
                sampling=SamplingConfig(temperature=0.7, top_p=0.9, max_tokens=12, seed=i),
            )
            for i in range(6)
        ]
        async with OpenAICompatibleClient(srv.url, "tiny", timeout=120) as client:
            together = await asyncio.gather(*(client.complete(r) for r in requests))
            alone = [await client.complete(r) for r in requests]
    finally:
        srv.stop()
    for a, b in zip(together, alone, strict=True):
        assert a.completion_token_ids == b.completion_token_ids
        assert a.completion_logprobs == b.completion_logprobs
    model, _ = load_model(tiny_model_dir())
    logprobs_BT, _ = sequence_logprobs(
        model, _trainer_batch(together, 0.7, 0.9), batch_invariant=True
    )
    for b, response in enumerate(together):
        start, length = len(response.prompt_token_ids), len(response.completion_logprobs)
        served_L = torch.tensor(response.completion_logprobs, dtype=torch.float32)
        assert torch.equal(logprobs_BT[b, start : start + length], served_L)

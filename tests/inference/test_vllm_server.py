"""vLLM server extension: the parts that run without a GPU, and a GPU test that skips here."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest
import torch
import uvicorn
from fastapi import FastAPI

from ludic.inference.vllm import logits as vllm_logits
from ludic.inference.vllm import routes as vllm_routes
from ludic.inference.vllm import server as vllm_server
from ludic.models import tiny_model_dir

HAS_VLLM = importlib.util.find_spec("vllm") is not None
HAS_CUDA = torch.cuda.is_available()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed")
def test_using_it_without_vllm_raises_a_clear_import_error() -> None:
    # the command says it in one line (it printed two chained tracebacks before the line)
    with pytest.raises(SystemExit, match=r"^ludic.inference.vllm.server: error: .*needs vLLM"):
        vllm_server.main(["model"])
    with pytest.raises(ImportError, match="embedded server"):
        vllm_server.start_vllm_server("model")


def test_a_broken_vllm_install_says_what_to_remove(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = OSError("Could not load this library: libtorchcodec_image.so")
    monkeypatch.setattr(vllm_logits, "VLLM_IMPORT_ERROR", broken)
    with pytest.raises(SystemExit, match=r"installed but does not import.*torchcodec"):
        vllm_server.main(["model"])


def test_serve_args_add_extensions_and_keep_user_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(vllm_server.TOKEN_ENV, "restored")  # monkeypatch restores the variable
    monkeypatch.delenv(vllm_server.TOKEN_ENV)
    argv = ["m", "--ludic-token", "s3cret", "--logprobs-mode=raw_logprobs"]
    args = vllm_server.vllm_serve_args(argv)
    assert "--ludic-token" not in args and "s3cret" not in args
    assert vllm_server.TOKEN_ENV not in os.environ  # the caller's environment is left alone
    assert vllm_server.ludic_token(argv) == "s3cret"
    assert args[args.index("--worker-extension-cls") + 1].endswith(".WeightSyncWorkerExtension")
    assert args[args.index("--logits-processors") + 1].endswith(":MaxThinkLogitsProcessor")
    assert args[args.index("--middleware") + 1].endswith(".ludic_middleware")
    assert args.count("--logprobs-mode=raw_logprobs") == 1 and "--logprobs-mode" not in args
    assert args[args.index("--generation-config") + 1] == "vllm"
    # By default behaviour logprobs are those of the distribution sampled (after temperature,
    # top-k, top-p): what the trainer recomputes.
    default = vllm_server.vllm_serve_args(["m"])
    assert default[default.index("--logprobs-mode") + 1] == "processed_logprobs"


def test_main_runs_vllm_serve_on_the_v1_model_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    def fake_vllm_main() -> None:
        seen["argv"] = list(sys.argv)
        seen["runner"] = vllm_server.os.environ.get(vllm_server.MODEL_RUNNER_ENV)

    cli = SimpleNamespace(main=fake_vllm_main)
    for name in ("vllm", "vllm.entrypoints", "vllm.entrypoints.cli"):
        monkeypatch.setitem(sys.modules, name, SimpleNamespace())
    monkeypatch.setitem(sys.modules, "vllm.entrypoints.cli.main", cli)
    monkeypatch.setattr(vllm_server, "require_vllm", lambda: None)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.delenv(vllm_server.MODEL_RUNNER_ENV, raising=False)
    monkeypatch.delenv(vllm_server.TOKEN_ENV, raising=False)
    vllm_server.main(["m", "--port", "8001"])
    argv = seen["argv"]
    assert isinstance(argv, list) and argv[:5] == ["vllm", "serve", "m", "--port", "8001"]
    assert "--logits-processors" in argv and seen["runner"] == "0"
    monkeypatch.setenv(vllm_server.MODEL_RUNNER_ENV, "1")  # the user's choice is kept
    vllm_server.main(["m"])
    assert seen["runner"] == "1"
    monkeypatch.delenv(vllm_server.MODEL_RUNNER_ENV)
    vllm_server.main(["m", "--no-max-think"])  # no processor: vLLM picks its runner
    argv = seen["argv"]
    assert isinstance(argv, list) and "--no-max-think" not in argv
    assert "--logits-processors" not in argv and "--worker-extension-cls" in argv
    assert seen["runner"] is None


def test_the_token_comes_from_the_flag_else_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(vllm_server.TOKEN_ENV, "from-env")
    assert vllm_server.ludic_token(["m", "--ludic-token=from-flag"]) == "from-flag"
    args = vllm_server.vllm_serve_args(["m", "--ludic-token=from-flag"])
    assert not any(a.startswith("--ludic-token") or "from-flag" in a for a in args)
    assert vllm_server.ludic_token(["m"]) == "from-env"
    monkeypatch.delenv(vllm_server.TOKEN_ENV)
    assert vllm_server.ludic_token(["m"]) is None
    with pytest.raises(ValueError, match="--ludic-token needs a value"):
        vllm_server.ludic_token(["m", "--ludic-token"])


@pytest.mark.parametrize(("flag", "env"), [(["--ludic-token", "s3cret\n"], None), ([], " s3cret")])
def test_a_token_no_header_can_carry_stops_the_server_before_vllm_starts(
    monkeypatch: pytest.MonkeyPatch, flag: list[str], env: str | None
) -> None:
    started: list[list[str]] = []
    for name in ("vllm", "vllm.entrypoints", "vllm.entrypoints.cli"):
        monkeypatch.setitem(sys.modules, name, SimpleNamespace())
    cli = SimpleNamespace(main=lambda: started.append(list(sys.argv)))
    monkeypatch.setitem(sys.modules, "vllm.entrypoints.cli.main", cli)
    monkeypatch.setattr(vllm_server, "require_vllm", lambda: None)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setenv(vllm_server.TOKEN_ENV, "restored")  # monkeypatch restores the variable
    if env is None:
        monkeypatch.delenv(vllm_server.TOKEN_ENV)
    else:
        monkeypatch.setenv(vllm_server.TOKEN_ENV, env)
    with pytest.raises(SystemExit, match=r"--ludic-token or \$LUDIC_SERVER_TOKEN\) must be "):
        vllm_server.main(["m", *flag])
    assert started == []
    vllm_server.main(["m", "--ludic-token", "s3cret"])  # this process serves the endpoints
    assert os.environ[vllm_server.TOKEN_ENV] == "s3cret" and "s3cret" not in started[0]


@pytest.mark.parametrize("token", [None, "sécret"])
def test_vllm_without_a_usable_token_answers_403_as_ludic_serve(
    monkeypatch: pytest.MonkeyPatch, token: str | None
) -> None:
    from fastapi.testclient import TestClient

    monkeypatch.setenv(vllm_server.TOKEN_ENV, "restored")
    if token is None:
        monkeypatch.delenv(vllm_server.TOKEN_ENV)
    else:
        monkeypatch.setenv(vllm_server.TOKEN_ENV, token)
    app = FastAPI()
    app.middleware("http")(vllm_server.ludic_middleware)
    with TestClient(app, headers={"Authorization": "Bearer anything"}) as client:
        reply = client.get("/ludic/version")
    assert reply.status_code == 403, reply.text
    said = reply.json()["error"]["message"]
    assert "start the server with a token (--ludic-token T)" in said
    assert ("printable ASCII" in said) == (token is not None)


class FakeCacheEngine:
    """`reset_prefix_cache` like vLLM's engine client: refuses `refusals` times, then resets."""

    def __init__(self, refusals: int, takes_running: bool) -> None:
        self.refusals = refusals
        self.calls: list[dict[str, object]] = []
        if takes_running:
            self.reset_prefix_cache = self.reset_with_running

    async def reset_prefix_cache(self) -> bool:
        return self._answer({})

    async def reset_with_running(self, reset_running_requests: bool = False) -> bool:
        return self._answer({"reset_running_requests": reset_running_requests})

    def _answer(self, kwargs: dict[str, object]) -> bool:
        self.calls.append(kwargs)
        self.refusals -= 1
        return self.refusals < 0


async def test_prefix_cache_reset_preempts_running_requests_or_retries_until_done() -> None:
    newer = FakeCacheEngine(refusals=0, takes_running=True)
    await vllm_server.reset_prefix_cache(newer)
    assert newer.calls == [{"reset_running_requests": True}]
    older = FakeCacheEngine(refusals=2, takes_running=False)
    await vllm_server.reset_prefix_cache(older, poll_s=0)
    assert older.calls == [{}, {}, {}]  # refused twice while requests held blocks
    stuck = FakeCacheEngine(refusals=10**9, takes_running=False)
    with pytest.raises(RuntimeError, match="refused to reset its prefix cache"):
        await vllm_server.reset_prefix_cache(stuck, timeout_s=0.05, poll_s=0.01)


def make_processor() -> vllm_server.MaxThinkLogitsProcessor:
    model_config = SimpleNamespace(tokenizer=str(tiny_model_dir()), trust_remote_code=False)
    return vllm_server.MaxThinkLogitsProcessor(
        SimpleNamespace(model_config=model_config), "cpu", False
    )


def test_max_think_processor_forces_close_only_when_thinking_is_open() -> None:
    proc = make_processor()
    (open_id,), (close_id,) = proc.open_ids, proc.close_ids
    thinking, closed, plain = [5, 6], [5, 6], [7]
    params = SimpleNamespace(extra_args={"max_think": 2})
    update = SimpleNamespace(
        removed=[],
        added=[
            (0, params, [1, open_id], thinking),
            (1, params, [1, open_id, 9, close_id], closed),
            (2, SimpleNamespace(extra_args=None), [1, open_id], plain),
        ],
        moved=[],
    )
    proc.update_state(update)  # type: ignore[arg-type]
    logits = torch.zeros(3, 600)
    out = proc.apply(logits.clone())
    assert out[0].argmax() == close_id and torch.isinf(out[0]).sum() == 599
    assert torch.equal(out[1], logits[1]) and torch.equal(out[2], logits[2])
    thinking.append(close_id)  # vLLM appends to the live list; the close sequence is done
    assert torch.equal(proc.apply(logits.clone())[0], logits[0])
    proc.update_state(SimpleNamespace(removed=[0], added=[], moved=[]))  # type: ignore[arg-type]
    assert 0 not in proc.rows
    assert proc.needs_output_token_ids()  # it reads the ids, not only their count
    with pytest.raises(ValueError, match="max_think"):
        vllm_server.MaxThinkLogitsProcessor.validate_params(
            SimpleNamespace(extra_args={"max_think": 0})
        )


class FakeVLLMEngine:
    """Answers `generate` like vLLM's engine client with prompt logprobs: position 0 is None,
    position i maps the prompt token (and the top token, when it differs) to a Logprob."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.params: list[object] = []

    async def generate(self, prompt: dict[str, list[int]], params: object, request_id: str):  # type: ignore[no-untyped-def]
        self.params.append(params)
        ids = prompt["prompt_token_ids"]
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([ids])).logits[0, :-1]
        logprobs = torch.log_softmax(logits.float(), -1)
        positions: list[dict[int, SimpleNamespace] | None] = [None]
        for row, token in zip(logprobs, ids[1:], strict=True):
            top = int(row.argmax())
            positions.append(
                {t: SimpleNamespace(logprob=float(row[t]), rank=1) for t in {top, token}}
            )
        yield SimpleNamespace(prompt_logprobs=None)  # an intermediate output
        yield SimpleNamespace(prompt_logprobs=positions)


def test_logprobs_probe_reads_vllm_prompt_logprobs(monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    from ludic.distributed.verification import (
        HttpPolicyProbe,
        check_served_policy,
        default_probe_tokens,
        reference_logprobs,
    )
    from ludic.models import load_tiny_model

    model, _ = load_tiny_model(seed=0)
    monkeypatch.setenv(vllm_server.TOKEN_ENV, "s3cret")
    monkeypatch.setattr(vllm_routes, "probe_sampling_params", lambda: "probe-params")
    app = FastAPI()
    app.middleware("http")(vllm_server.ludic_middleware)
    app.state.engine_client = engine = FakeVLLMEngine(model)
    with TestClient(app, headers={"Authorization": "Bearer s3cret"}) as client:
        ids = default_probe_tokens(model.config.vocab_size)
        probe = HttpPolicyProbe(client)
        served = probe.served_logprobs(ids)
        check_served_policy(
            version=0,
            served_version=probe.served_version(),
            expected_logprobs=reference_logprobs(model, ids),
            served_logprobs=served,
            atol=1e-5,
        )
        assert len(served) == len(ids) - 1 and engine.params == ["probe-params"]
        for bad in ([5], [1, -2], "12", [1, True]):
            reply = client.post("/ludic/logprobs", json={"token_ids": bad})
            assert reply.status_code == 400 and "token_ids" in reply.text
        reply = client.post(
            "/ludic/logprobs", json={"token_ids": ids}, headers={"Authorization": ""}
        )
        assert reply.status_code == 401
        non_ascii = {"Authorization": "Bearer sécret".encode()}
        reply = client.post("/ludic/logprobs", json={"token_ids": ids}, headers=non_ascii)
        assert reply.status_code == 401  # a mismatch like any other, not a server error


@pytest.fixture
def tiny_health_server() -> Iterator[str]:
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def test_wait_for_health(tiny_health_server: str) -> None:
    vllm_server.wait_for_health(tiny_health_server + "/v1", timeout_s=30)
    with pytest.raises(TimeoutError, match="did not report healthy"):
        vllm_server.wait_for_health(f"http://127.0.0.1:{free_port()}", timeout_s=1)
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    dead.wait()
    with pytest.raises(RuntimeError, match="exited with code 3"):  # not TimeoutError
        vllm_server.wait_for_health(f"http://127.0.0.1:{free_port()}", timeout_s=60, process=dead)


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_VLLM and HAS_CUDA), reason="needs vLLM and a CUDA GPU")
async def test_vllm_server_tokens_logprobs_and_nccl_weight_sync(tmp_path: object) -> None:
    from ludic.distributed import BroadcastPolicyPublisher
    from ludic.inference import ChatRequest, SamplingConfig
    from ludic.inference.http.openai_client import OpenAICompatibleClient
    from ludic.models import load_tiny_model

    port, token = free_port(), "gpu-test"
    model_dir = str(tiny_model_dir())
    proc = vllm_server.start_vllm_server(
        model_dir,
        port=port,
        token=token,
        extra_args=["--gpu-memory-utilization", "0.2", "--enforce-eager"],
    )
    url = f"http://127.0.0.1:{port}"
    try:
        vllm_server.wait_for_health(url, timeout_s=600, process=proc)
        async with OpenAICompatibleClient(url, model_dir) as client:
            request = ChatRequest(
                messages=[{"role": "user", "content": "hi"}],
                sampling=SamplingConfig(max_tokens=8, seed=1),
            )
            first = await client.complete(request)
            assert len(first.completion_token_ids) == len(first.completion_logprobs or ()) > 0
            assert first.prompt_token_ids and first.policy_version == 0
            other, tokenizer = load_tiny_model(seed=1)
            think_prompt = tokenizer.encode(
                "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>"
            )
            capped = await client.complete(
                ChatRequest(
                    messages=[],
                    prompt_token_ids=think_prompt,
                    sampling=SamplingConfig(
                        max_tokens=6, max_think=2, seed=1, extras={"ignore_eos": True}
                    ),
                )
            )
            assert capped.completion_token_ids[2] == tokenizer.convert_tokens_to_ids("</think>")
            publisher = BroadcastPolicyPublisher(url, token, backend="nccl", probe_model=other)
            publisher.publish({k: v.cuda() for k, v in other.state_dict().items()}, version=1)
            version = httpx.get(
                url + "/ludic/version", headers={"Authorization": f"Bearer {token}"}
            )
            assert version.json() == {"policy_version": 1}
            second = await client.complete(request)
            assert (
                second.policy_version == 1
                and second.completion_token_ids != first.completion_token_ids
            )
    finally:
        proc.terminate()
        proc.wait(timeout=60)

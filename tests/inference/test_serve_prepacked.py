"""`ludic serve --prepacked-gemm`: the server runs its GEMMs on packed weight copies (its
logprobs are the packed engine's, not the default one's), generates, and after every broadcast
weight push serves the new weights (the packs are refreshed, never stale). Conflicting flags
are refused before the model loads, naming the flag."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import pytest
import torch

from ludic.distributed import BroadcastPolicyPublisher
from ludic.inference.client import ChatRequest
from ludic.inference.embedded.engine import EngineConfig
from ludic.inference.http import serve_run
from ludic.inference.http.local_server import LocalServer
from ludic.inference.http.openai_client import OpenAICompatibleClient
from ludic.inference.http.serve_config import ServeConfig, check_serve_config
from ludic.inference.http.server import serve
from ludic.inference.sampling import SamplingConfig
from ludic.models import tiny_model_dir
from ludic.models.loading import load_model

PROMPT = [5, 9, 13, 7, 21, 4]
TOKENS = 12
NOISE = 1e-3  # float rounding of another GEMM kernel, with room
CHANGE = 0.05  # what the weight changes below move logprobs by, at least
TOKEN = "prepacked-token"
GREEDY = SamplingConfig(temperature=0.0, max_tokens=TOKENS, extras={"ignore_eos": True})


def forced_logprobs(model: torch.nn.Module, completion: list[int]) -> list[float]:
    """The model's own (transformers forward) logprobs of `completion` after `PROMPT`."""
    ids_1T = torch.tensor([PROMPT + completion])
    with torch.no_grad():
        logits_TV = model(input_ids=ids_1T).logits[0, len(PROMPT) - 1 : -1].float()
    logprobs_TV = torch.log_softmax(logits_TV, -1)
    return logprobs_TV.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1).tolist()


def perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    new = copy.deepcopy(model)
    with torch.no_grad():
        for p in new.parameters():
            if p.dim() == 2:
                p.add_(0.3 * p.std() * torch.randn(p.shape, generator=generator))
    return new


def worst(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def served(url: str) -> tuple[list[int], list[float]]:
    async def ask() -> tuple[list[int], list[float]]:
        client = OpenAICompatibleClient(url, model="tiny")
        try:
            request = ChatRequest(messages=[], prompt_token_ids=PROMPT, sampling=GREEDY)
            response = await client.complete(request)
        finally:
            await client.aclose()
        return list(response.completion_token_ids), list(response.completion_logprobs)

    return asyncio.run(ask())


@pytest.mark.slow
def test_a_prepacked_server_generates_and_serves_every_pushed_version(tmp_path: Path) -> None:
    model, _ = load_model(tiny_model_dir(), dtype=torch.float32)
    server = LocalServer(
        tiny_model_dir(),
        threads=1,
        token=TOKEN,
        served_model_name="tiny",
        args=("--prepacked-gemm",),
        log_path=tmp_path / "serve.log",
        startup_timeout_s=120,
    )
    with server:
        tokens, logprobs = served(server.url)
        assert len(tokens) == TOKENS
        assert worst(logprobs, forced_logprobs(model, tokens)) < NOISE
        publisher = BroadcastPolicyPublisher(server.url, TOKEN, timeout_s=60)
        try:
            for version in (1, 2):
                new = perturbed(model, seed=version)
                old_tokens, _ = served(server.url)
                assert worst(logprobs, forced_logprobs(new, old_tokens)) > CHANGE
                publisher.publish(new, version=version)
                tokens, logprobs = served(server.url)
                assert worst(logprobs, forced_logprobs(new, tokens)) < NOISE  # not stale
        finally:
            publisher.close()


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (dict(batch_invariant=True), r"--prepacked-gemm and --batch-invariant"),
        (dict(device="cuda:0"), r"--prepacked-gemm packs weights for the CPU.*--device"),
        (dict(dtype="bfloat16"), r"--prepacked-gemm needs float32.*bfloat16.*--dtype float32"),
    ],
)
def test_conflicting_serve_flags_are_refused_before_the_model_loads(
    tmp_path: Path, flags: dict[str, object], words: str
) -> None:
    config = ServeConfig(model=str(tmp_path / "absent"), prepacked_gemm=True, **flags)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=words):
        serve(config)  # no model there: loading it would fail differently


def test_a_float16_model_directory_is_refused_under_dtype_auto(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float16"}))
    config = ServeConfig(model=str(tmp_path), prepacked_gemm=True)
    with pytest.raises(ValueError, match=r"loads? as float16; pass --dtype float32"):
        check_serve_config(config)
    check_serve_config(ServeConfig(model=str(tmp_path), prepacked_gemm=True, dtype="float32"))
    check_serve_config(ServeConfig(model=str(tiny_model_dir()), prepacked_gemm=True))


def test_serve_builds_its_engine_with_packed_gemms(monkeypatch: pytest.MonkeyPatch) -> None:
    """The flag reaches the engine `ludic serve` builds (the packed and the default GEMMs
    differ only by float noise, so the end-to-end test above cannot tell them apart)."""
    built: list[EngineConfig] = []

    class Engine:
        model = torch.nn.Linear(1, 1)  # `ludic serve` names the device and dtype it serves on
        policy_version = 0  # and the policy version

        def close(self) -> None:
            pass

    def from_pretrained(path: str, **kwargs: object) -> Engine:
        config = kwargs["config"]
        assert isinstance(config, EngineConfig)
        built.append(config)
        return Engine()

    monkeypatch.setattr(serve_run.EmbeddedEngine, "from_pretrained", from_pretrained)
    monkeypatch.setattr(serve_run, "create_app", lambda *a, **k: None)
    monkeypatch.setattr("uvicorn.run", lambda *a, **k: None)
    serve(ServeConfig(model=str(tiny_model_dir()), prepacked_gemm=True, port=0))  # any free port
    serve(ServeConfig(model=str(tiny_model_dir()), port=0))
    assert [c.prepacked_gemm for c in built] == [True, False]

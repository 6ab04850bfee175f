"""`ServeConfig`: the options of `ludic serve` (the embedded inference server), and
`check_serve_config`, which refuses options that cannot go together (or that the model's
config.json rules out) before any model loads, `served_name`, the model name the server answers
to, and `saved_dtype`, the dtype a model directory records.

Kept apart from `ludic.inference.http.server` so that building the CLI parser imports no torch.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "CHECKPOINT_SERVED_NAME",
    "ServeConfig",
    "check_serve_config",
    "saved_dtype",
    "served_name",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class ServeConfig:
    """Serve a local model directory with the embedded engine over HTTP."""

    model: str
    """Local model directory (config.json + weights + tokenizer)."""
    host: str = "127.0.0.1"
    """Interface to bind; keep the loopback default unless the server must be reachable."""
    port: int = 8000
    """TCP port to listen on."""
    token: str | None = None
    """Bearer token for the /ludic/ control endpoints (default: $LUDIC_SERVER_TOKEN, which `ps`
    does not show); without one they are disabled."""
    max_body_bytes: int = 8 * 2**20
    """Largest request body accepted (413 beyond it); the weight upload is exempt."""
    header_timeout: float = 30.0
    """Seconds a connection may take to send a request's head (from when it opens, or from the
    first byte after a reply); then it is closed (408 if part came), so clients that trickle
    bytes cannot hold connections until good clients are refused."""
    body_timeout: float = 30.0
    """Seconds the server waits for a request's body, plus 1 s per 64 KiB of it received (a
    large weight upload over a slow link still lands); a body that stops arriving gets a 408
    and its connection closed. Also how long a reply waits for its client to read (then the
    connection is dropped and a streamed request cancelled)."""
    served_model_name: str | None = None
    """Name reported by /v1/models and expected in requests (default: the directory name; a
    training checkpoint, `.../step_N` or `.../step_N/model`, serves as "ludic")."""
    dtype: str = "auto"
    """Weight dtype: auto (as saved), float32, bfloat16 or float16."""
    device: str = "cpu"
    """Torch device for the model, e.g. cpu or cuda:0."""
    verify: Literal["sha256", "size"] = "sha256"
    """What a training checkpoint's model files are checked for against its MANIFEST.json before
    loading: sha256, sizes and contents (one pass over the weights: about a minute for a 28 GB
    checkpoint), or size, sizes only (no pass: a file changed at the same size, a flipped bit,
    loads and its wrong weights are served unnoticed). A missing or truncated file is refused
    under both."""
    policy_version: int | None = None
    """The policy version the server starts at, which its replies carry until a trainer pushes
    weights (default: a training checkpoint's saved version, else 0). Pass 0 when a new run
    starts from a checkpoint's weights (its learner counts from 0); a resumed run's samples are
    then counted fresh by default."""
    max_batch_size: int = 64
    """Most sequences decoded together."""
    max_model_len: int | None = None
    """Context length (default: the model's max_position_embeddings; more than it is refused)."""
    logprobs_mode: Literal["processed", "raw"] = "processed"
    """processed: logprobs of the distribution sampled from; raw: the model's own."""
    batch_invariant: bool = False
    """Serve batch-invariant (`EngineConfig(batch_invariant=True)`): a seeded request's tokens and
    logprobs do not depend on what else is in the batch or when it arrives, and a trainer with
    `TrainerConfig(batch_invariant=True)` on the same device and dtype recomputes its logprobs
    bit for bit. Slower; Llama-family models; refused at start-up where this machine cannot
    honour it."""
    prepacked_gemm: bool = False
    """Run the engine's GEMMs on weight copies packed once per weight version
    (`EngineConfig(prepacked_gemm=True)`): 1.1x-1.6x faster decode on CPU, for a second copy of
    the weights in memory and a different rounding: behaviour logprobs differ from a trainer's
    recomputation by float noise (~1e-5..1e-4), which ratio losses see. Packs are refreshed
    after every weight push. Float32 on CPU only; not with --batch-invariant."""
    threads: int | None = None
    """torch intra-op threads (default: torch's choice)."""
    log_level: str = "warning"
    """uvicorn log level."""


CHECKPOINT_SERVED_NAME = "ludic"
"""The name every training checkpoint serves under by default, whichever step it is."""
_STEP = re.compile(r"^step_\d+$")
MAX_POLICY_VERSION = 2**63 - 1
"""The largest --policy-version: samples carry their versions as int64."""


def served_name(config: ServeConfig) -> str:
    """The model name the server answers to: `--served-model-name`, else "ludic" for a
    training checkpoint (a `step_N` folder or its `model/`, so clients need not know the
    step), else the model directory's name."""
    if config.served_model_name:
        return config.served_model_name
    path = Path(config.model).expanduser()
    folder = path.resolve() if path.exists() else path
    if _STEP.match(folder.name) or (folder.name == "model" and _STEP.match(folder.parent.name)):
        return CHECKPOINT_SERVED_NAME
    return os.path.basename(os.path.normpath(config.model))


def check_serve_config(config: ServeConfig) -> None:
    """ValueError naming the flags when `config` combines options the engine cannot run; called
    before the model loads (the model's saved dtype and context length are read from its
    config.json)."""
    if config.policy_version is not None and config.policy_version < 0:
        raise ValueError(f"--policy-version must be >= 0, got {config.policy_version}")
    if config.policy_version is not None and config.policy_version > MAX_POLICY_VERSION:
        raise ValueError(  # a sample carries its version as an int64: the learner refuses more
            f"--policy-version must be at most 2**63-1, got {config.policy_version}"
        )
    if not 0 <= config.port < 65536:  # else a traceback from socket.bind (0: any free port)
        raise ValueError(f"--port must be in 0..65535, got {config.port}")
    if config.max_body_bytes < 1:
        raise ValueError(f"--max-body-bytes must be >= 1, got {config.max_body_bytes}")
    for flag, seconds in (("header", config.header_timeout), ("body", config.body_timeout)):
        if not 0 < seconds < float("inf"):  # also nan
            raise ValueError(
                f"--{flag}-timeout must be a positive number of seconds, got {seconds}"
            )
    _check_max_model_len(config)
    if not config.prepacked_gemm:
        return
    if config.batch_invariant:
        raise ValueError(
            "--prepacked-gemm and --batch-invariant round their GEMMs differently; pass one of "
            "them (--batch-invariant: reproducible logprobs; --prepacked-gemm: faster decode)"
        )
    if not config.device.startswith("cpu"):
        raise ValueError(
            f"--prepacked-gemm packs weights for the CPU's oneDNN GEMMs; --device is "
            f"{config.device!r}: drop --prepacked-gemm or serve with --device cpu"
        )
    dtype = config.dtype if config.dtype != "auto" else saved_dtype(config.model)
    if dtype not in (None, "float32"):
        hint = "--dtype float32" if config.dtype == "auto" else "--dtype float32 (or auto)"
        raise ValueError(
            f"--prepacked-gemm needs float32 weights, and the model would load as {dtype}; "
            f"pass {hint} or drop --prepacked-gemm"
        )


def _check_max_model_len(config: ServeConfig) -> None:
    """Refuse --max-model-len beyond the positions the model was built for (vLLM refuses it
    too): the engine would serve it, past positions the model never saw. A model whose
    config.json scales its rotary positions (rope_scaling) is left to the engine."""
    if config.max_model_len is None:
        return
    if config.max_model_len < 1:
        raise ValueError(
            f"--max-model-len must be >= 1 (or left out: the model's context), got "
            f"{config.max_model_len}"
        )
    saved = _saved_config(config.model) or {}
    limit = saved.get("max_position_embeddings")
    rope = saved.get("rope_scaling") or saved.get("rope_parameters") or {}
    scaled = isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) not in (
        None,
        "default",
    )
    if isinstance(limit, int) and not scaled and config.max_model_len > limit:
        raise ValueError(
            f"--max-model-len {config.max_model_len} is more than the model's context, "
            f"{limit} positions (max_position_embeddings in {config.model}'s config.json): pass "
            f"--max-model-len {limit} or less, or leave it out"
        )


def saved_dtype(model_dir: str) -> str | None:
    """The dtype a model directory's config.json records (None when it records none, or when
    there is no readable config.json: loading the model reports that); a checkpoint step
    folder's is its `model/`'s (as `ludic.models.model_directory`)."""
    saved = _saved_config(model_dir)
    dtype = (saved.get("torch_dtype") or saved.get("dtype")) if saved else None
    return str(dtype) if dtype else None


def _saved_config(model_dir: str) -> dict[str, Any] | None:
    """A model directory's config.json (a checkpoint step folder's: its `model/`'s), or None
    when it is missing or not a JSON object."""
    config_file = Path(model_dir) / "config.json"
    if not config_file.is_file():
        config_file = Path(model_dir) / "model" / "config.json"
    try:
        saved = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # loading the model reports a missing or broken directory
    return saved if isinstance(saved, dict) else None

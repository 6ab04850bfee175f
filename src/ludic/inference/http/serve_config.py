"""`ServeConfig`: the options of `ludic serve` (the embedded inference server).

Kept apart from `ludic.inference.http.server` so that building the CLI parser imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


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
    served_model_name: str | None = None
    """Name reported by /v1/models and expected in requests (default: the directory name)."""
    dtype: str = "auto"
    """Weight dtype: auto (as saved), float32, bfloat16 or float16."""
    device: str = "cpu"
    """Torch device for the model, e.g. cpu or cuda:0."""
    max_batch_size: int = 64
    """Most sequences decoded together."""
    max_model_len: int | None = None
    """Context length (default: the model's max_position_embeddings)."""
    logprobs_mode: Literal["processed", "raw"] = "processed"
    """processed: logprobs of the distribution sampled from; raw: the model's own."""
    batch_invariant: bool = False
    """Serve batch-invariant (`EngineConfig(batch_invariant=True)`): a seeded request's tokens and
    logprobs do not depend on what else is in the batch or when it arrives, and a trainer with
    `TrainerConfig(batch_invariant=True)` on the same device and dtype recomputes its logprobs
    bit for bit. Slower; Llama-family models; refused at start-up where this machine cannot
    honour it."""
    threads: int | None = None
    """torch intra-op threads (default: torch's choice)."""
    log_level: str = "warning"
    """uvicorn log level."""

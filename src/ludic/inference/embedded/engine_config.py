"""Configuration and status records of the embedded engine: `EngineConfig` (its knobs, checked
on construction) and `EngineStatus` (what `/health` reports). The engine itself lives in
`ludic.inference.embedded.engine`; nothing here touches a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ludic.inference.embedded.token_sampling import LogprobsMode


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineConfig:
    """Knobs of the embedded engine.

    `logprobs_mode` "processed" reports log-softmax of the distribution actually sampled from
    (after temperature, top-k, top-p; forced max_think tokens get 0.0); "raw" reports the
    model's unprocessed log-softmax, like vLLM's default `raw_logprobs`.
    `prefix_cache_tokens` bounds the KV kept from finished requests so that a prompt extending
    one (the next turn of an episode) prefills only its new tokens; 0 turns reuse off. Each
    token costs layers x 2 x kv_heads x head_dim x dtype bytes (4 KiB for the tiny model).
    `lean_forward` runs Llama-family models (Llama, Mistral, Qwen2, Qwen3) through
    `ludic.inference.embedded.lean_forward` instead of the transformers forward (same arithmetic, less
    per-step overhead); other models, or a failed self-check, use the transformers forward.
    `batch_invariant` makes a seeded request's tokens and logprobs bit for bit independent of
    what else is in the batch and of when it arrives (`ludic.inference.embedded.batch_invariant`): the
    lean forward computes each position as it would alone (prefill, decode step or a reused
    prefix give the same bits, so prefix reuse stays on). It needs a
    Llama-family model and a start-up check that this machine's GEMMs are row-invariant;
    otherwise the engine refuses to start (ValueError) rather than promise it silently.
    `prepacked_gemm` runs the lean forward's GEMMs through oneDNN on weights packed once per
    weight version (`ludic.inference.embedded.lean_forward`): 1.1x (3M) to 1.6x (49M
    parameters) faster decode on the CPUs measured, for a second copy of the weights in memory
    and a different rounding: logprobs move by float noise (~1e-5 to 1e-4 in float32) against
    the default, the transformers forward and the trainer's recomputation. Float32 on CPU only,
    not with `batch_invariant`; otherwise the engine refuses to start (ValueError).
    """

    max_batch_size: int = 64
    max_prefill_tokens: int = 16384
    max_model_len: int | None = None
    logprobs_mode: LogprobsMode = "processed"
    eos_token_ids: tuple[int, ...] | None = None
    prefix_cache_tokens: int = 16384
    lean_forward: bool = True
    batch_invariant: bool = False
    prepacked_gemm: bool = False

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"EngineConfig.max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.logprobs_mode not in ("processed", "raw"):
            raise ValueError(
                f"EngineConfig.logprobs_mode must be 'processed' or 'raw', got {self.logprobs_mode!r}"
            )
        if self.batch_invariant and self.prepacked_gemm:
            raise ValueError(
                "EngineConfig: batch_invariant and prepacked_gemm round their GEMMs differently; "
                "set one of them"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineStatus:
    """What `/health` reports: whether the worker runs, its load, the last step error, prompts
    that reused cached KV and requests cancelled before they finished (their clients left)."""

    running: bool
    active: int
    pending: int
    policy_version: int
    last_error: str | None
    prefix_hits: int = 0
    cancelled: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "active": self.active,
            "pending": self.pending,
            "policy_version": self.policy_version,
            "last_error": self.last_error,
            "prefix_hits": self.prefix_hits,
            "cancelled": self.cancelled,
        }


def model_context(model: Any) -> int:
    """The context (prompt and completion, in tokens) the embedded engine and `ludic serve`
    give `model` without a `max_model_len`: its config's `max_position_embeddings`, else 2048."""
    return int(getattr(model.config, "max_position_embeddings", 0) or 2048)

"""`TrainerConfig`: every knob of the optimisation loop in one dataclass (field docstrings
become `--help` with tyro). Algorithm choices (credit, loss) are not here: they are the
`RLAlgorithm` passed to the Trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from ludic.training.checkpoint import CheckpointConfig
from ludic.training.option_warnings import warn_unread_option
from ludic.training.schedule import LR_SCHEDULES, LRSchedule

DType = Literal["float32", "bfloat16"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainerConfig:
    """Optimisation, batching, staleness, publishing, checkpointing and device settings."""

    lr: float = 1e-5
    """AdamW learning rate (peak, after warmup)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient L2 norm to this (None: no clipping; the norm is still logged)."""
    lr_schedule: LRSchedule = "constant"
    """After warmup: constant, cosine or linear decay to min_lr_ratio * lr over total_steps."""
    warmup_steps: int = 0
    """Linear warmup over this many applied updates."""
    total_steps: int | None = None
    """Updates the decay spans (needed by cosine and linear; with constant, one given is
    ignored with an `UnreadOptionWarning`)."""
    min_lr_ratio: float = 0.0
    """Floor of the decayed LR as a fraction of lr (cosine and linear; with constant, a
    non-zero one is ignored with an `UnreadOptionWarning`)."""
    micro_batch_tokens: int | None = None
    """Token budget of one forward/backward (padding counted); None: the batch in one go."""
    max_seq_len: int | None = None
    """Cap sequences at this many tokens (marked seq_len_truncated); None: no cap."""
    packing: bool = False
    """Pack each micro-batch's sequences into one row (position ids restart per sequence)."""
    pad_token_id: int = 0
    """Token id used for right padding (never trained on)."""
    logprob_chunk_tokens: int = 1024
    """Positions per chunk of the float32 log-softmax (bounds extra memory to chunk x vocab)."""
    max_lag: int | None = None
    """Drop samples whose oldest token is more than this many policy versions old."""
    initial_policy_version: int = 0
    """Policy version of the starting weights."""
    publish_every: int = 1
    """Publish weights every N applied updates (when a publisher is given)."""
    checkpoint: CheckpointConfig | None = None
    """Periodic checkpoints (directory, every_n_steps, keep_last); None: no checkpoints."""
    eval_every: int | None = None
    """Call the eval hook every N steps (None: never)."""
    max_skipped_steps: int | None = 5
    """Stop with `TrainingStalledError` (naming the cause: stale samples, failed episodes, an
    empty batch, non-finite loss) after this many steps in a row trained nothing; None: never
    stop."""
    seed: int = 0
    """Seeds python, numpy and torch when the Trainer is built."""
    device: str = "cpu"
    """Device the model trains on. Under torchrun (WORLD_SIZE > 1) "cuda" means each rank's
    cuda:LOCAL_RANK with NCCL, "cpu" means gloo; the model is then sharded with FSDP2."""
    batch_invariant: bool = False
    """Recompute logprobs with the batch-invariant embedded engine's arithmetic
    (`ludic.training.invariant_forward`): on-policy samples from an
    `EngineConfig(batch_invariant=True)` engine on the same device and dtype get a ratio of
    exactly 1. Llama-family models only; not with packing."""
    shared_prefix: bool = False
    """Run a group's shared prompt once in the training forward (GRPO: G completions of one
    prompt), not once per row, with micro-batches keeping such groups together
    (`ludic.training.shared_prefix`; same logprobs and gradients within rounding). Used where
    it pays (>= 2 rows sharing >= `MIN_SHARED_TOKENS` tokens); off in batch-invariant mode (an
    `UnreadOptionWarning` says so) and for a model it cannot run (a warning names why).
    Off by default: it pays for long shared prompts (forward+backward 0.61x at 64 prompt tokens)
    but its second model call costs more than it saves on short rows of tiny models (the
    quickstart's GRPO stage: 75 s per-row, 97 s with it)."""
    compile: bool = False
    """torch.compile each MLP and RMSNorm of the model in place, dynamic shapes
    (`ludic.training.compiled`): fuses the elementwise work around the GEMMs, same results
    within float rounding. The first step pays the compile; pays in long runs. Single process
    only (refused under FSDP2)."""
    fused_adamw: bool = False
    """Build the default AdamW with `fused=True` (one kernel per parameter instead of a
    handful of elementwise passes); same update within float rounding, not bit for bit."""
    dtype: DType = "float32"
    """Autocast dtype of the forward pass (float32: no autocast). Weights keep their dtype;
    float16 is not offered (it would need loss scaling)."""
    contiguous_parameters: bool | None = None
    """Lay the model's parameters out back to back, one storage per dtype, before the
    optimizer is built (`ludic.training.contiguous_params`: same parameters, same values), so
    a weight push sends a few spans without a packing copy. None: when a publisher is given
    and the model is neither sharded (FSDP2) nor LoRA; True: always (refused for those two);
    False: never."""

    def __post_init__(self) -> None:
        _positive("lr", self.lr)
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        if self.lr_schedule != "constant" and self.total_steps is None:
            raise ValueError(f"lr_schedule={self.lr_schedule!r} needs total_steps")
        if (
            self.lr_schedule != "constant"
            and self.total_steps is not None
            and self.warmup_steps >= self.total_steps
        ):
            # The decay would start at or after its own end: the LR warms up to the full lr
            # and then drops to the floor within one update (or never decays in the run).
            raise ValueError(
                f"lr_schedule={self.lr_schedule!r} decays after warmup_steps={self.warmup_steps}"
                f" until total_steps={self.total_steps}, which leaves nothing to decay over: "
                f"make total_steps larger than warmup_steps, shorten the warmup, or use "
                f"lr_schedule='constant'"
            )
        for name in ("warmup_steps", "initial_policy_version"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("publish_every", "logprob_chunk_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in (
            "max_grad_norm",
            "micro_batch_tokens",
            "total_steps",
            "eval_every",
            "max_skipped_steps",
        ):
            value = getattr(self, name)
            if value is not None:
                _positive(name, value)
        if self.max_lag is not None and self.max_lag < 0:
            raise ValueError(f"max_lag must be >= 0 or None, got {self.max_lag}")
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise ValueError(f"max_seq_len must be >= 2 or None, got {self.max_seq_len}")
        if self.batch_invariant and self.dtype != "float32":
            raise ValueError(
                f"batch_invariant recomputes the engine's logprobs bit for bit, which autocast "
                f"to dtype={self.dtype!r} breaks (its logprobs move by ~1e-3): use "
                f"dtype='float32' (`ludic train --dtype float32`) or drop batch_invariant"
            )
        if self.batch_invariant and self.packing:
            raise ValueError(
                "batch_invariant computes each sequence as its own row: set packing=False"
            )
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.batch_invariant and self.shared_prefix:
            warn_unread_option(
                "TrainerConfig",
                "shared_prefix",
                True,
                "batch_invariant=True computes every row whole (its forward takes no KV cache)",
            )
        if self.lr_schedule == "constant" and self.total_steps is not None:
            warn_unread_option(
                "TrainerConfig",
                "total_steps",
                self.total_steps,
                "lr_schedule='constant' never decays (total_steps is the length of a 'cosine' "
                "or 'linear' decay)",
            )
        if self.lr_schedule == "constant" and self.min_lr_ratio != 0.0:
            warn_unread_option(
                "TrainerConfig",
                "min_lr_ratio",
                self.min_lr_ratio,
                "lr_schedule='constant' never decays (the floor is read by 'cosine' and 'linear')",
            )

    @property
    def torch_dtype(self) -> torch.dtype:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16}[self.dtype]


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")

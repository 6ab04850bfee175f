"""Shared fixtures for trainer tests: a tiny Llama, hand-made samples, in-memory batch sources,
a minimal loss implementing the Loss protocol, and one-process runtimes that script a peer rank."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ludic.rollouts.samples import SAWItem
from ludic.training import LocalRuntime, LossInputs, LossOutput, SAWBatch
from ludic.types import JSON

VOCAB = 300


def tiny_llama(seed: int = 0, vocab: int = VOCAB, dropout: float = 0.0) -> LlamaForCausalLM:
    """~50k parameters, deterministic given `seed`, global RNG untouched."""
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        attention_dropout=dropout,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        return LlamaForCausalLM(config)


def item(
    n: int,
    *,
    prompt: int = 2,
    weight: float = 1.0,
    seed: int = 0,
    logprobs: bool = True,
    versions: Sequence[int] = (),
    **meta: object,
) -> SAWItem:
    """A sample of n tokens whose last n - prompt tokens are actions."""
    rng = random.Random(seed)
    ids = tuple(rng.randrange(1, VOCAB) for _ in range(n))
    mask = tuple(0 if i < prompt else 1 for i in range(n))
    lp = tuple(-0.5 - 0.01 * i if m else 0.0 for i, m in enumerate(mask)) if logprobs else None
    full_meta: JSON = {"policy_versions": list(versions), **meta}
    return SAWItem(
        input_ids=ids, action_mask=mask, weight=weight, behavior_logprobs=lp, meta=full_meta
    )


def shared_prompt_group(prompt: int, lengths: list[int], seed: int) -> list[SAWItem]:
    """Rows with the same first `prompt` tokens (a GRPO group) and their own completions."""
    rows = [item(n, prompt=prompt, seed=seed + i) for i, n in enumerate(lengths)]
    head = rows[0].input_ids[:prompt]
    return [
        SAWItem(
            input_ids=head + row.input_ids[prompt:],
            action_mask=row.action_mask,
            weight=row.weight,
            behavior_logprobs=row.behavior_logprobs,
            meta=row.meta,
        )
        for row in rows
    ]


def mixed_items(count: int = 6, seed: int = 0) -> list[SAWItem]:
    """Samples of varied lengths and signed weights."""
    rng = random.Random(seed)
    return [
        item(
            rng.randrange(5, 20),
            prompt=rng.randrange(1, 4),
            weight=rng.uniform(-1.0, 1.0),
            seed=seed * 100 + i,
        )
        for i in range(count)
    ]


class ListSource:
    """Serves fixed batches in order, cycling; its position is its checkpointable state."""

    def __init__(self, batches: Sequence[Sequence[SAWItem]]) -> None:
        self.batches = [list(b) for b in batches]
        self.position = 0

    async def next_batch(self) -> SAWBatch:
        items = self.batches[self.position % len(self.batches)]
        self.position += 1
        return SAWBatch(items=items, stats={"position": float(self.position)})

    def state_dict(self) -> JSON:
        return {"position": self.position}

    def load_state_dict(self, state: JSON) -> None:
        self.position = int(state["position"])


@dataclass(frozen=True, kw_only=True)
class WeightedNLL:
    """loss = -sum_bt m * A_b * logp_bt / total_action_tokens (REINFORCE, token mean); with
    `poison=True` it returns nan."""

    poison: bool = False

    @property
    def needs_ref_logprobs(self) -> bool:
        return False

    @property
    def needs_entropy(self) -> bool:
        return False

    def __call__(self, inputs: LossInputs) -> LossOutput:
        mask = inputs.action_mask_BT > 0
        terms = torch.where(mask, inputs.advantages_B[:, None] * inputs.logprobs_BT, 0.0)
        loss = -terms.sum() / inputs.total_action_tokens
        if self.poison:
            loss = loss * float("nan")
        return LossOutput(
            loss=loss, metrics={"tokens": float(mask.sum()) / inputs.total_action_tokens}
        )


def params_snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class CountingRuntime(LocalRuntime):
    """One process, counting the agreement calls it is asked for."""

    def __init__(self) -> None:
        super().__init__("cpu")
        self.calls: list[str] = []

    def any_rank(self, flag: bool) -> bool:
        self.calls.append("any_rank")
        return flag

    def all_gather_object(self, obj: Any) -> list[Any]:
        self.calls.append("all_gather_object")
        return [obj]


class PeerRuntime(CountingRuntime):
    """This process as rank `rank` of 2; what the other rank contributes to agreements is
    `peer_cause` (its failure's cause, None when it did fine; or any object it gathers)."""

    def __init__(self, rank: int, peer_cause: Any = None) -> None:
        super().__init__()
        self._rank, self.peer_cause = rank, peer_cause

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return 2

    @property
    def is_main(self) -> bool:
        return self._rank == 0

    def any_rank(self, flag: bool) -> bool:
        self.calls.append("any_rank")
        return flag or self.peer_cause is not None

    def all_gather_object(self, obj: Any) -> list[Any]:
        self.calls.append("all_gather_object")
        return [obj, self.peer_cause] if self._rank == 0 else [self.peer_cause, obj]

    def broadcast_object(self, obj: Any) -> Any:
        self.calls.append("broadcast_object")
        return obj if self._rank == 0 else (False, self.peer_cause)

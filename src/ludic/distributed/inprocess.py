"""`InProcessPublisher`: pushes weights into an inference engine living in the same process
(`ludic.inference.EmbeddedEngine`, or anything with its `update_weights` method), then checks
the push took effect. No serialisation or network: tensors are copied in place. Weights holding
a nan or an inf are refused before the engine is called (`NonFiniteWeightsError`: the policy
diverged), whatever the engine checks itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from ludic.distributed.checksum import Checksum, cast_for, checksums, mismatched
from ludic.distributed.interfaces import Weights, check_publishable
from ludic.distributed.manifest import dtype_name
from ludic.distributed.verification import (
    check_served_policy,
    default_probe_tokens,
    probe_atol,
    trainer_logprobs,
    vocab_size_of,
)


class WeightTarget(Protocol):
    """What the publisher needs from an engine (EmbeddedEngine has these, and `model`, whose
    weights verification reads back)."""

    def update_weights(
        self, weights: Mapping[str, torch.Tensor] | torch.nn.Module, *, version: int | None = None
    ) -> int: ...

    def logprobs(self, token_ids: Sequence[int]) -> list[float]: ...


class InProcessPublisher:
    """Calls `engine.update_weights(state_dict, version=version)` and verifies the result.

    With `verify` (default), after every push: the engine must report back `version`; every
    tensor the engine's model holds afterwards must have the checksum of the one published (an
    engine that reports the version but skipped the load, or one tensor, or a tiny update, is
    caught). Whether the published weights are finite is checked before every push (verified
    or not). On the first push and every
    `probe_every`-th: the engine's logprobs on `probe_token_ids` (default: 16 fixed ids) must
    be finite and match the published model's (or `probe_model`'s, when a state dict is
    published) within `atol` (for a full-precision engine; a half-precision one widens it to
    `verification.PROBE_ATOL`).
    A sharded (FSDP2) model is probed through a non-sharded twin holding the published state,
    on this rank alone.
    """

    def __init__(
        self,
        engine: WeightTarget,
        *,
        verify: bool = True,
        probe_token_ids: Sequence[int] | None = None,
        probe_model: torch.nn.Module | None = None,
        probe_every: int = 10,
        atol: float = 1e-4,
    ) -> None:
        if probe_every < 1:
            raise ValueError(f"probe_every must be >= 1, got {probe_every}")
        if probe_token_ids is not None and len(probe_token_ids) < 2:
            raise ValueError("probe_token_ids needs at least 2 tokens (a prefix and a target)")
        if verify and not isinstance(getattr(engine, "model", None), torch.nn.Module):
            raise ValueError(
                f"{type(engine).__name__} has no `model` whose weights can be read back, so a "
                "publish cannot be verified: give the engine a `model` attribute or pass "
                "verify=False"
            )
        self.engine = engine
        self.verify = verify
        self.probe_token_ids = None if probe_token_ids is None else list(probe_token_ids)
        self.probe_model = probe_model
        self.probe_every = probe_every
        self.atol = atol
        self.num_published = 0

    def publish(self, weights: Weights, *, version: int) -> None:
        state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
        check_publishable(state, version=version)  # before the engine holds any of it
        sent = checksums(state) if self.verify else None
        served_version = self.engine.update_weights(state, version=version)
        if sent is not None:
            self._verify(weights, state, sent, version, served_version)
        self.num_published += 1

    def _verify(
        self,
        weights: Weights,
        state: Mapping[str, torch.Tensor],
        sent: dict[str, Checksum],
        version: int,
        served_version: int,
    ) -> None:
        served_model: torch.nn.Module = self.engine.model  # type: ignore[attr-defined]
        live = served_model.state_dict()
        held = {name: live[name] for name in state if name in live}
        held_dtypes = {n: dtype_name(t.dtype) for n, t in held.items() if t.dtype != state[n].dtype}
        if held_dtypes:
            sent = {**sent, **checksums(state, cast_to=cast_for(state, held_dtypes))}
        model = weights if isinstance(weights, torch.nn.Module) else self.probe_model
        ids = self.probe_token_ids or default_probe_tokens(vocab_size_of(served_model))
        probe_due = self.num_published % self.probe_every == 0
        expected = None if model is None or not probe_due else trainer_logprobs(model, state, ids)
        floating = [t.dtype for t in held.values() if t.is_floating_point()]
        served_dtype = floating[0] if floating else torch.float32
        check_served_policy(
            version=version,
            served_version=served_version,
            expected_logprobs=expected,
            served_logprobs=self.engine.logprobs(ids) if probe_due else None,
            atol=probe_atol(dtype_name(served_dtype), default=self.atol),
            mismatched_tensors=mismatched(sent, checksums(held)),
        )

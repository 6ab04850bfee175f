"""The `PolicyPublisher` seam: how the Trainer hands new weights to inference.

A publisher pushes a model (or its state dict) tagged with a policy version; where the weights
go (an in-process engine, a vLLM server over NCCL, ...) is the implementation's business. The
Trainer never knows which one it has. Every publisher refuses weights holding a nan or an inf
before any byte leaves (`check_publishable`): a diverged policy stops the run, and the servers
keep serving the last good weights. A caller that has just checked them itself (the Trainer,
over every rank's local shards before the gather) publishes within `finite_checked()`, and the
publisher skips its own pass over the gathered state.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from ludic.inference.weights import NonFiniteWeightsError

Weights = torch.nn.Module | Mapping[str, torch.Tensor]


@runtime_checkable
class PolicyPublisher(Protocol):
    """Makes `weights` the served policy, labelled `version`; blocks until it is in effect."""

    def publish(self, weights: Weights, *, version: int) -> None: ...


class PublishVerificationError(RuntimeError):
    """After a push, the served policy is not the one that was published."""


_FINITE_CHECKED: ContextVar[bool] = ContextVar("ludic_finite_checked", default=False)


@contextmanager
def finite_checked() -> Iterator[None]:
    """Publish within it when the weights were just checked to be finite (the Trainer does,
    over every rank's local shards, before gathering): `check_publishable` then skips its pass,
    but for tensors a wire cast narrowed. Outside it every publisher checks."""
    token = _FINITE_CHECKED.set(True)
    try:
        yield
    finally:
        _FINITE_CHECKED.reset(token)


def check_publishable(
    state: Mapping[str, torch.Tensor],
    *,
    version: int,
    cast_from: Mapping[str, torch.Tensor] | None = None,
) -> None:
    """Raise `NonFiniteWeightsError` (`diverged_error`) when a floating tensor of `state` holds
    a nan or an inf (`ludic.inference.weights.check_finite`: one float sum per tensor). Called
    by a publisher before any byte leaves. Within `finite_checked()` only the tensors cast to a
    narrower range than they have in `cast_from` (the state before a wire cast: e.g. float32
    to float16 can overflow to inf) are checked, and none without it."""
    from ludic.inference.weights import NonFiniteWeightsError, check_finite  # imports us back

    if _FINITE_CHECKED.get():
        state = {k: t for k, t in state.items() if _narrowed(cast_from, k, t)}
        if not state:
            return
    try:
        check_finite(state)
    except NonFiniteWeightsError as e:
        raise diverged_error(e.names, version=version) from None


def _narrowed(before: Mapping[str, torch.Tensor] | None, name: str, after: torch.Tensor) -> bool:
    """Whether `after` was cast from `before[name]` to a float type with a clearly smaller
    range (float32 to bfloat16 is not: the same exponent range)."""
    if before is None or name not in before or not after.is_floating_point():
        return False
    source = before[name]
    if not source.is_floating_point() or source.dtype == after.dtype:
        return False
    return torch.finfo(after.dtype).max < torch.finfo(source.dtype).max / 2


def diverged_error(names: Sequence[str], *, version: int) -> NonFiniteWeightsError:
    """The publisher's refusal of weights whose tensors `names` hold a nan or an inf."""
    from ludic.inference.weights import NonFiniteWeightsError

    shown = ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
    return NonFiniteWeightsError(
        names,
        f"publish: refused to send policy version {version}: {len(names)} tensor(s) of the "
        f"trainer's weights hold nan or inf ({shown}). Nothing was sent: inference keeps "
        "serving the last good weights. The policy diverged: lower the learning rate (or "
        "warm it up longer), check the loss and grad_norm metrics of the last steps, and resume "
        "from the last checkpoint taken before it diverged",
    )

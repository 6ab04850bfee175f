"""The `PolicyPublisher` seam: how the Trainer hands new weights to inference.

A publisher pushes a model (or its state dict) tagged with a policy version; where the weights
go (an in-process engine, a vLLM server over NCCL, ...) is the implementation's business. The
Trainer never knows which one it has. Every publisher refuses weights holding a nan or an inf
before any byte leaves (`check_publishable`): a diverged policy stops the run, and the servers
keep serving the last good weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


def check_publishable(state: Mapping[str, torch.Tensor], *, version: int) -> None:
    """Raise `NonFiniteWeightsError` (`diverged_error`) when a floating tensor of `state` holds
    a nan or an inf (`ludic.inference.weights.check_finite`: one float sum per tensor). Called
    by a publisher before any byte leaves."""
    from ludic.inference.weights import NonFiniteWeightsError, check_finite  # imports us back

    try:
        check_finite(state)
    except NonFiniteWeightsError as e:
        raise diverged_error(e.names, version=version) from None


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

"""The `PolicyPublisher` seam: how the Trainer hands new weights to inference.

A publisher pushes a model (or its state dict) tagged with a policy version; where the weights
go (an in-process engine, a vLLM server over NCCL, ...) is the implementation's business. The
Trainer never knows which one it has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import torch

Weights = torch.nn.Module | Mapping[str, torch.Tensor]


@runtime_checkable
class PolicyPublisher(Protocol):
    """Makes `weights` the served policy, labelled `version`; blocks until it is in effect."""

    def publish(self, weights: Weights, *, version: int) -> None: ...


class PublishVerificationError(RuntimeError):
    """After a push, the served policy is not the one that was published."""

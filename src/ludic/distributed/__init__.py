"""The trainer-to-inference weight path: publishing new policy weights to the engines and
servers that sample from them. The `PolicyPublisher` seam and its
implementations (in-process, and HTTP + torch.distributed broadcast), each verified with exact
checksums of what the receiver holds and a logprob probe. A custom publisher or receiver plans
its buckets with `plan_manifest`; `fused_groups` names the tensors a Llama-family server runs as
one GEMM (its default `together`), to extend with another model family's groups. Every
publisher refuses weights holding a nan or an inf before sending them
(`NonFiniteWeightsError`, from `ludic.inference.weights`)."""

from typing import Any

from ludic.distributed.broadcast import (
    BroadcastPolicyPublisher,
    PushStats,
    TrainerReplaced,
    WeightPushError,
)
from ludic.distributed.checksum import checksums, tensor_checksum
from ludic.distributed.inprocess import InProcessPublisher, WeightTarget
from ludic.distributed.interfaces import PolicyPublisher, PublishVerificationError, Weights
from ludic.distributed.manifest import ManifestError, WeightManifest, fused_groups, plan_manifest
from ludic.distributed.server_link import ControlNotOffered, PushRefused, TooFewServers
from ludic.distributed.verification import (
    HttpPolicyProbe,
    PolicyProbe,
    check_served_policy,
    compare_logprobs,
    default_probe_tokens,
    probe_atol,
    reference_logprobs,
    reference_logprobs_from_state,
)

__all__ = [
    "BroadcastPolicyPublisher",
    "ControlNotOffered",
    "HttpPolicyProbe",
    "InProcessPublisher",
    "ManifestError",
    "NonFiniteWeightsError",
    "PolicyProbe",
    "PolicyPublisher",
    "PublishVerificationError",
    "PushRefused",
    "PushStats",
    "TooFewServers",
    "TrainerReplaced",
    "WeightManifest",
    "WeightPushError",
    "WeightTarget",
    "Weights",
    "check_served_policy",
    "checksums",
    "compare_logprobs",
    "default_probe_tokens",
    "fused_groups",
    "plan_manifest",
    "probe_atol",
    "reference_logprobs",
    "reference_logprobs_from_state",
    "tensor_checksum",
]


def __getattr__(name: str) -> Any:
    if name == "NonFiniteWeightsError":  # lazily: `ludic.inference.weights` imports this package
        from ludic.inference.weights import NonFiniteWeightsError

        return NonFiniteWeightsError
    raise AttributeError(f"module 'ludic.distributed' has no attribute {name!r}")

"""Checking, after a push, that the server serves what the trainer published.

Two signals: the policy version the server reports, and the server's logprobs on a fixed token
sequence compared with the trainer's own. A sync that silently did nothing keeps the old
weights, so the probe differs (unless the weights did not change, when nothing was lost). The
checks are pure functions; `HttpPolicyProbe` asks a server's `/ludic/version` and
`/ludic/logprobs`. Nothing here sends weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import torch

from ludic.distributed.interfaces import PublishVerificationError


class PolicyProbe(Protocol):
    """What verification asks the serving side."""

    def served_version(self) -> int: ...

    def served_logprobs(self, token_ids: Sequence[int]) -> list[float]: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeComparison:
    """How the served logprobs differ from the trainer's: the worst gap and where."""

    max_abs_diff: float
    positions: tuple[int, ...]
    """Indices (into the logprob list, i.e. token position - 1) with a gap above atol."""


def default_probe_tokens(vocab_size: int, *, length: int = 16, seed: int = 0) -> list[int]:
    """A fixed pseudo-random token sequence in [0, vocab_size) (same for every call)."""
    if vocab_size < 1 or length < 2:
        raise ValueError(f"need vocab_size >= 1 and length >= 2, got {vocab_size}, {length}")
    generator = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(0, vocab_size, (length,), generator=generator)]


def vocab_size_of(model: torch.nn.Module) -> int:
    """The model's input vocabulary (config.vocab_size, else its input embedding rows)."""
    config = getattr(model, "config", None)
    size = getattr(config, "vocab_size", None)
    if isinstance(size, int) and size > 0:
        return size
    get_embeddings = getattr(model, "get_input_embeddings", None)
    if callable(get_embeddings):
        return int(get_embeddings().weight.shape[0])
    raise ValueError("cannot tell the model's vocab size: pass probe_token_ids explicitly")


def reference_logprobs(model: torch.nn.Module, token_ids: Sequence[int]) -> list[float]:
    """The model's log p(token_ids[t] | token_ids[:t]) for t >= 1, in eval mode, float32."""
    if len(token_ids) < 2:
        raise ValueError("the probe needs at least 2 tokens (a prefix and a target)")
    param = next(model.parameters())
    ids_1T = torch.tensor([list(token_ids)], device=param.device)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            logits_TV = model(input_ids=ids_1T).logits[0, :-1].float()
    finally:
        model.train(was_training)
    lp_T = torch.log_softmax(logits_TV, -1).gather(-1, ids_1T[0, 1:, None]).squeeze(-1)
    return [float(x) for x in lp_T.tolist()]


def compare_logprobs(
    expected: Sequence[float], served: Sequence[float], *, atol: float
) -> ProbeComparison:
    """The largest absolute gap and the positions above `atol` (nan counts as a gap)."""
    if len(expected) != len(served):
        raise PublishVerificationError(
            f"the server returned {len(served)} probe logprobs, the trainer computed "
            f"{len(expected)}: the probe did not run on the same tokens"
        )
    gaps = [abs(a - b) for a, b in zip(expected, served, strict=True)]
    bad = tuple(i for i, g in enumerate(gaps) if not g <= atol)
    worst = max((g if math.isfinite(g) else math.inf for g in gaps), default=0.0)
    return ProbeComparison(max_abs_diff=worst, positions=bad)


def check_served_policy(
    *,
    version: int,
    served_version: int,
    expected_logprobs: Sequence[float] | None,
    served_logprobs: Sequence[float] | None,
    atol: float,
) -> None:
    """Raise PublishVerificationError saying what diverged: the version, the probe, or both."""
    problems = []
    if served_version != version:
        problems.append(f"the server reports policy version {served_version}, expected {version}")
    if expected_logprobs is not None and served_logprobs is not None:
        comparison = compare_logprobs(expected_logprobs, served_logprobs, atol=atol)
        if comparison.positions:
            shown = ", ".join(str(p) for p in comparison.positions[:8])
            more = "" if len(comparison.positions) <= 8 else ", ..."
            problems.append(
                f"probe logprobs differ from the trainer's by up to {comparison.max_abs_diff:.4g} "
                f"(atol {atol:g}) at {len(comparison.positions)} of {len(expected_logprobs)} "
                f"positions [{shown}{more}]"
            )
    if problems:
        raise PublishVerificationError(
            f"weight push of version {version} did not take effect: "
            + "; ".join(problems)
            + " (the server may have skipped or only partly applied the update)"
        )


class HttpPolicyProbe:
    """Asks a server's bearer-token control endpoints `/ludic/version` and `/ludic/logprobs`."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    def served_version(self) -> int:
        return int(_json(self.http.get("/ludic/version"))["policy_version"])

    def served_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        body = _json(self.http.post("/ludic/logprobs", json={"token_ids": list(token_ids)}))
        return [float(x) for x in body["logprobs"]]


def _json(response: httpx.Response) -> dict[str, Any]:
    if response.status_code != 200:
        raise PublishVerificationError(
            f"{response.request.method} {response.request.url.path} failed "
            f"({response.status_code}): {response.text[:500]}"
        )
    body: dict[str, Any] = response.json()
    return body

"""Checking, after a push, that the server serves what the trainer published.

Three signals: the policy version the server reports; exact checksums of the tensors the server
holds after loading against the sent ones (`ludic.distributed.checksum`: a skipped tensor, a
load that never happened or a dropped 1e-6 update all show); and the server's logprobs on a
fixed token sequence against the trainer's, within a tolerance that follows the served dtype
(numerics: a wrong forward, and nan or inf, which always fail). The reference logprobs come
from the trainer's model, or, when that model is sharded (FSDP2: its forward is a collective),
from a non-sharded twin holding the gathered weights, on the publishing rank alone. The checks
are pure functions; `HttpPolicyProbe` asks a server's `/ludic/version` and `/ludic/logprobs`.
Nothing here sends weights.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import torch

from ludic.distributed.held_check import HeldComparison
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


PROBE_ATOL: dict[str, float] = {"float32": 1e-3, "float64": 1e-3, "float16": 5e-2, "bfloat16": 2e-1}
"""Default probe tolerance by the served dtype: the reference is float32; a half-precision
server's logprobs differ from it by rounding alone (exactness is the checksums' job)."""


def probe_atol(served_dtype: str | None, default: float = 1e-3) -> float:
    """The probe tolerance for a server serving `served_dtype`: `default` for full precision
    (or an unknown dtype), the wider `PROBE_ATOL` entry for half precision."""
    if served_dtype in ("float16", "bfloat16"):
        return max(default, PROBE_ATOL[served_dtype])
    return default


def is_sharded(model: torch.nn.Module) -> bool:
    """The model holds DTensor (FSDP2) parameters: its forward is a collective."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def reference_logprobs(model: torch.nn.Module, token_ids: Sequence[int]) -> list[float]:
    """The model's log p(token_ids[t] | token_ids[:t]) for t >= 1, in eval mode, float32."""
    if len(token_ids) < 2:
        raise ValueError("the probe needs at least 2 tokens (a prefix and a target)")
    if is_sharded(model):
        raise ValueError(
            "reference_logprobs on a sharded (FSDP2) model would run a collective on one rank "
            "and hang: use reference_logprobs_from_state with the gathered weights"
        )
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


def reference_logprobs_from_state(
    model: torch.nn.Module, state: Mapping[str, torch.Tensor], token_ids: Sequence[int]
) -> list[float]:
    """`reference_logprobs` of a non-sharded twin of `model`'s architecture holding `state`
    (full weights, e.g. gathered from FSDP2 shards, LoRA merged in), run on this rank alone.

    The twin is a Hugging Face model built from `model`'s config (the base model of a LoRA
    model) on the meta device; `state`'s tensors are assigned, not copied, and buffers that
    are not in a state dict (rotary frequencies) are shared with `model`."""
    twin = _twin(model, state)
    return reference_logprobs(twin, token_ids)


def trainer_logprobs(
    model: torch.nn.Module, state: Mapping[str, torch.Tensor], token_ids: Sequence[int]
) -> list[float]:
    """The trainer's probe reference: `model`'s own forward, or, when it is sharded (a
    collective that would hang on one rank), a twin holding `state` (the gathered weights)."""
    if is_sharded(model):
        return reference_logprobs_from_state(model, state, token_ids)
    return reference_logprobs(model, token_ids)


def _twin(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    from torch.distributed.fsdp import FSDPModule

    get_base = getattr(model, "get_base_model", None)  # peft: the merged state is the base's
    base: torch.nn.Module = get_base() if callable(get_base) else model
    config = getattr(base, "config", None)
    if config is None:
        raise ValueError(
            f"cannot build a probe twin of {type(base).__name__} (no Hugging Face config): "
            "pass probe=False, or publish an unsharded model"
        )
    cls = next(
        c
        for c in type(base).__mro__
        if issubclass(c, torch.nn.Module) and not issubclass(c, FSDPModule)
    )
    with torch.device("meta"):
        twin = cls(config)
    twin.load_state_dict(dict(state), strict=False, assign=True)
    tie = getattr(twin, "tie_weights", None)
    if callable(tie) and any(p.is_meta for p in twin.parameters()):
        tie()  # a tied lm_head left out of the state dict
    sources = dict(base.named_modules())
    for name, module in twin.named_modules():
        source = sources.get(name)
        for key, buffer in list(module._buffers.items()):
            if buffer is not None and buffer.is_meta and source is not None:
                module._buffers[key] = source._buffers[key]
        for key, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and value.is_meta and source is not None:
                setattr(module, key, getattr(source, key))
    left = [n for n, t in [*twin.named_parameters(), *twin.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(
            f"the published weights do not cover the probe twin of {cls.__name__}: "
            f"{left[:3]} missing; pass probe=False or publish the full state dict"
        )
    return twin


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
    mismatched_tensors: Sequence[str] = (),
    unverified: str | None = None,
    nonfinite_tensors: Sequence[str] = (),
) -> None:
    """Raise PublishVerificationError saying what diverged: the version, the held weights'
    checksums (`mismatched_tensors`; `unverified`: why they could not be compared), the
    probe, non-finite logprobs."""
    problems = []
    if served_version != version:
        problems.append(f"the server reports policy version {served_version}, expected {version}")
    if mismatched_tensors:
        shown = ", ".join(mismatched_tensors[:5])
        more = "" if len(mismatched_tensors) <= 5 else ", ..."
        problems.append(
            f"{len(mismatched_tensors)} tensors the server holds after loading differ from the "
            f"ones sent (checksums) [{shown}{more}]"
        )
    if unverified is not None:
        problems.append(unverified)
    if nonfinite_tensors:
        problems.append(
            f"the published weights hold nan or inf in {len(nonfinite_tensors)} tensors "
            f"{list(nonfinite_tensors[:5])}"
        )
    for who, values in (("trainer's", expected_logprobs), ("server's", served_logprobs)):
        bad = [i for i, v in enumerate(values or ()) if not math.isfinite(v)]
        if bad:
            problems.append(
                f"the {who} probe logprobs are not finite (nan or inf) at positions {bad[:8]}"
            )
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
            f"weight push of version {version} failed verification: "
            + "; ".join(problems)
            + " (the server may have skipped or only partly applied the update, or the weights "
            "are not finite; do not train on its samples until a push verifies)"
        )


def check_pushed_server(
    http: httpx.Client,
    *,
    version: int,
    reply: Mapping[str, Any],
    held: HeldComparison,
    probe_ids: Sequence[int] | None,
    expected_logprobs: Sequence[float] | None,
    atol: float,
) -> None:
    """Raise PublishVerificationError unless the server behind `http` serves the push of
    `version` whose load answered `reply`: its version (the load's own report wins), the held
    checksums (`held`) and, with `probe_ids`, its logprobs against the trainer's."""
    probe = HttpPolicyProbe(http)
    served_version = probe.served_version()
    finished_version = int(reply["policy_version"])
    if finished_version != version:  # the load itself reported another version
        served_version = finished_version
    served = probe.served_logprobs(probe_ids) if probe_ids is not None else None
    check_served_policy(
        version=version,
        served_version=served_version,
        expected_logprobs=expected_logprobs,
        served_logprobs=served,
        atol=atol,
        mismatched_tensors=held.mismatched,
        unverified=held.unverified,
    )


class HttpPolicyProbe:
    """Asks a server's bearer-token control endpoints `/ludic/version` and `/ludic/logprobs`."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    def served_version(self) -> int:
        return int(_json(self.http.get("/ludic/version"))["policy_version"])

    def served_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        body = _json(self.http.post("/ludic/logprobs", json={"token_ids": list(token_ids)}))
        # JSON has no nan or inf: servers send null (or a string such as "NaN") instead.
        return [math.nan if x is None else float(x) for x in body["logprobs"]]


def _json(response: httpx.Response) -> dict[str, Any]:
    if response.status_code != 200:
        raise PublishVerificationError(
            f"{response.request.method} {response.request.url.path} failed "
            f"({response.status_code}): {response.text[:500]}"
        )
    body: dict[str, Any] = response.json()
    return body

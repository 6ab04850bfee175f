"""Token logprobs with each group's shared prompt computed once (GRPO: G completions of one
prompt run the prompt once, not G times).

`shared_prefix_logprobs(model, batch, groups)` returns exactly what
`logprobs.sequence_logprobs` returns (logprobs_BT and entropy_BT, same layout, 0 at position 0
and on padding), from two model calls instead of one:

1. the prefix call runs each group's first `shared_tokens - 1` tokens once, with the KV cache on;
2. the rest call runs every row from its last shared token on (that token is run once per row:
   its logits predict the row's own next token), attending to its group's prefix keys and
   values through `past_key_values`. Rows in no group run whole, their past masked out.

Gradients flow through the prefix's keys and values, so each shared token's activations get
the sum of what every row's loss sends them, which equals the per-row computation's gradient.
A shared token's logprob is computed once and handed to every row of the group (its sampling
transform is the same in all of them: `shared_prefix_groups` compares it).

Padded layout: prefixes are right-padded rows, the rows' past is their group's prefix picked
per row (`index_select`, differentiable) and a 2D attention mask hides a shorter prefix's
padding. Packed layout: prefixes are one packed row, rest tokens another, and a 4D mask lets
each rest token see its own prefix and its own row only (bool for SDPA, additive for eager
attention; memory rest x (prefix + rest) per micro-batch, as packing's own mask).

`sequence_logprobs` takes this path only when it computes fewer tokens (`takes_shared_path`:
padded, K x W + B x S < B x T; a long row sharing nothing widens every rest row). Data-parallel
ranks agree per micro-batch (`gradients.local_shared_passes`); a rank without a group then runs
a one-token prefix nobody attends to (`lockstep=True`), so all ranks make the same two calls.
So does a rank whose groups do not pay: it runs its rows whole behind that token (the per-row
tokens the planner budgeted, plus one), not its prefixes on top of the widened rest rows.

Not covered (`supports_shared_prefix` says why; `sequence_logprobs` then uses the per-row path):
batch-invariant logprobs (`invariant_forward` has no KV-cache input), models whose cache is not
a plain full-attention `DynamicCache` (sliding-window or hybrid layers), dynamic-NTK rope (its
rotary depends on each call's length), gradient checkpointing (HF turns the cache off under it),
and packed rows on an attention implementation other than SDPA or eager (no 4D mask).

Shape legend: B rows, T padded tokens, K prefix rows, W padded prefix tokens, S padded rest
tokens, P packed prefix tokens, R packed rest tokens, V vocabulary, N flat logit positions.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import DynamicCache

from ludic.inference.embedded.kv_cache import cache_kwarg
from ludic.training.collate import CollatedBatch, RowGroup, shared_prefix_pays
from ludic.training.logprobs import DEFAULT_CHUNK_TOKENS, _Knobs, _next_token_logprobs

__all__ = [
    "MIN_SHARED_TOKENS",
    "shared_prefix_logprobs",
    "shared_prefix_min_tokens",
    "supports_shared_prefix",
    "takes_shared_path",
]

logger = logging.getLogger(__name__)

MIN_SHARED_TOKENS = 8
"""Shortest shared prefix run once. Measured on the 3.2M tiny model, 2 groups of 8 rows with 64
completion tokens, one thread: forward+backward 1.03x (3-5 prompt tokens), 0.96x (8-12),
0.89x (16), 0.72x (32), 0.61x (64) of the per-row path: below ~8 the second model call costs
what it saves."""

_MASKABLE_ATTENTION = ("sdpa", "eager")


def shared_prefix_min_tokens(
    model: torch.nn.Module,
    *,
    enabled: bool,
    packed: bool = False,
    batch_invariant: bool = False,
    min_tokens: int = MIN_SHARED_TOKENS,
) -> int | None:
    """`min_tokens` when shared prefixes should run once for `model` (the Trainer's
    `TrainerConfig.shared_prefix`), else None: off, batch-invariant mode (its forward takes no
    KV cache; `TrainerConfig` warns of that), or a model `supports_shared_prefix` refuses
    (a warning with the reason: the user asked for the speed-up and does not get it)."""
    if not enabled or batch_invariant:
        return None
    reason = supports_shared_prefix(model, packed=packed)
    if reason is not None:
        logger.warning(
            "shared_prefix=True has no effect: shared prompts run once per row, because %s",
            reason,
        )
        return None
    return min_tokens


def supports_shared_prefix(model: torch.nn.Module, *, packed: bool) -> str | None:
    """None when `shared_prefix_logprobs` can run `model`, else the reason it cannot."""
    config: Any = getattr(model, "config", None)
    if not hasattr(DynamicCache(), "layers"):
        return "transformers is older than 4.56 (a DynamicCache without layers)"
    if config is None:
        return "the model has no Hugging Face config"
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    layer_types = getattr(text, "layer_types", None) or ()
    if any(kind != "full_attention" for kind in layer_types):
        return f"its layers are not all full attention ({sorted(set(layer_types))})"
    if getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True):
        return "it uses sliding-window attention"
    attention = getattr(config, "_attn_implementation", None) or "eager"
    if packed and attention not in _MASKABLE_ATTENTION:
        return f"packed rows need a 4D mask, which {attention!r} attention does not take"
    if _rope_type(text) == "dynamic":
        return "dynamic-NTK rope scales its rotary by each call's length (the two calls differ)"
    if _gradient_checkpointing(model):
        return "gradient checkpointing is on (it turns the KV cache the shared path needs off)"
    return None


def _rope_type(text: Any) -> str | None:
    """The rope scaling type of a text config (`rope_scaling`, or 4.56+'s `rope_parameters`)."""
    for name in ("rope_scaling", "rope_parameters"):
        params = getattr(text, name, None)
        if isinstance(params, dict):
            kind = params.get("rope_type", params.get("type"))
            if kind is not None:
                return str(kind)
    return None


def _gradient_checkpointing(model: torch.nn.Module) -> bool:
    """Whether any module of `model` (a PEFT wrapper's base model included) checkpoints: HF's
    checkpointed layers set `gradient_checkpointing` and force `use_cache=False`."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def takes_shared_path(
    model: torch.nn.Module, batch: CollatedBatch, groups: list[RowGroup], *, packed: bool
) -> bool:
    """Whether `sequence_logprobs` runs `batch` (grouped as `groups`) on the shared path: the
    model supports it and it computes fewer tokens (`collate.shared_prefix_pays`)."""
    lengths = [int(n) for n in batch.lengths_B.tolist()]
    if not shared_prefix_pays(lengths, groups, packed=packed):
        return False
    return supports_shared_prefix(model, packed=packed) is None


@dataclass(frozen=True, kw_only=True, slots=True)
class _Plan:
    """Where each row's tokens run. `group_B` is the prefix row of each row (-1: none) and
    `start_B` the first token of its rest call (its last shared token; 0 without a prefix)."""

    prefixes: list[RowGroup]
    group_B: list[int]
    start_B: list[int]
    lengths_B: list[int]


def _plan(batch: CollatedBatch, groups: list[RowGroup]) -> _Plan:
    b = batch.num_sequences
    group_B, start_B = [-1] * b, [0] * b
    prefixes = [group for group in groups if group.shared_tokens >= 2]
    for g, group in enumerate(prefixes):
        for row in group.rows:
            group_B[row], start_B[row] = g, group.shared_tokens - 1
    covered = sorted(row for group in groups for row in group.rows)
    if covered != list(range(b)):
        raise ValueError("shared_prefix_logprobs: the groups must hold every row exactly once")
    lengths = [int(n) for n in batch.lengths_B.tolist()]
    return _Plan(prefixes=prefixes, group_B=group_B, start_B=start_B, lengths_B=lengths)


def shared_prefix_logprobs(
    model: torch.nn.Module,
    batch: CollatedBatch,
    groups: list[RowGroup],
    *,
    packed: bool = False,
    with_entropy: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    lockstep: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs_BT, entropy_BT or None) of `batch`, equal to `sequence_logprobs(model, batch,
    packed=packed)` within rounding, with each group's shared prefix run once. `groups` cover
    every row once (`collate.shared_prefix_groups`). `lockstep=True` accepts groups that share
    nothing: the prefix call then runs one token nobody attends to, so this rank makes the
    same two model calls (forward and backward) as ranks that share (FSDP gathers per call);
    it also runs every row whole behind that token when `groups` do not pay
    (`collate.shared_prefix_pays`), so a pass forced onto the shared path costs at most one
    token more than the per-row path."""
    plan = _plan(batch, groups)
    if not plan.prefixes and not lockstep:
        raise ValueError("shared_prefix_logprobs: no group shares a prefix; use sequence_logprobs")
    if lockstep and plan.prefixes and not shared_prefix_pays(plan.lengths_B, groups, packed=packed):
        # another rank shares in this pass, this one's groups do not pay (a long row sharing
        # nothing): rows whole behind the lockstep prefix, the per-row tokens the planner
        # budgeted plus one, instead of the prefixes' tokens on top
        plan = _plan(batch, [RowGroup(rows=(row,)) for row in range(batch.num_sequences)])
    run = _run_packed if packed else _run_padded
    prefix_logits_NV, prefix_src_BT, rest_logits_NV, rest_src_BT = run(model, batch, plan)
    parts = [
        _logprobs_at(logits_NV, batch, src_BT, with_entropy, chunk_tokens)
        for logits_NV, src_BT in ((prefix_logits_NV, prefix_src_BT), (rest_logits_NV, rest_src_BT))
    ]
    n_prefix = prefix_logits_NV.shape[0]
    src_BT = torch.where(prefix_src_BT >= 0, prefix_src_BT, rest_src_BT + n_prefix)
    real_BT = (prefix_src_BT >= 0) | (rest_src_BT >= 0)
    return _gather(parts, src_BT, real_BT, 0), (
        _gather(parts, src_BT, real_BT, 1) if with_entropy else None
    )


def _gather(
    parts: list[tuple[torch.Tensor, torch.Tensor | None]],
    src_BT: torch.Tensor,
    real_BT: torch.Tensor,
    which: int,
) -> torch.Tensor:
    """Each (b, t) takes the value at its logit position (one zero slot for position 0 and
    padding): a gather, whose backward adds up the rows that share a prefix logit."""
    values_N = torch.cat([part[which] for part in parts])  # type: ignore[misc]
    flat_N = torch.cat([values_N, values_N.new_zeros(1)])
    index_BT = torch.where(real_BT, src_BT, torch.full_like(src_BT, flat_N.shape[0] - 1))
    return flat_N[index_BT]


def _logprobs_at(
    logits_NV: torch.Tensor,
    batch: CollatedBatch,
    src_BT: torch.Tensor,
    with_entropy: bool,
    chunk_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob (and entropy) at every logit position, of the token it predicts: the (b, t)
    whose source it is (`src_BT >= 0`; rows sharing a prefix write the same token and
    transform), a dummy target elsewhere."""
    n = logits_NV.shape[0]
    within_BT = src_BT >= 0
    where_M = src_BT[within_BT]
    targets_N = torch.zeros(n, dtype=torch.long, device=logits_NV.device)
    targets_N[where_M] = batch.input_ids_BT[within_BT]
    knobs_N: _Knobs | None = None
    if batch.sampling is not None:
        s = batch.sampling
        knobs_N = (
            _scatter(s.temperature_BT, within_BT, where_M, n, 1.0),
            _scatter(s.top_k_BT, within_BT, where_M, n, -1),
            _scatter(s.top_p_BT, within_BT, where_M, n, 1.0),
        )
    return _next_token_logprobs(logits_NV, targets_N, with_entropy, chunk_tokens, knobs_N)


def _scatter(
    values_BT: torch.Tensor, within_BT: torch.Tensor, where_M: torch.Tensor, n: int, identity: float
) -> torch.Tensor:
    out_N = torch.full((n,), identity, dtype=values_BT.dtype, device=values_BT.device)
    out_N[where_M] = values_BT[within_BT]
    return out_N


def _sources(plan: _Plan, t: int, prefix_at: Any, rest_at: Any) -> tuple[torch.Tensor, ...]:
    """[B, T] flat logit position predicting each token, in the prefix logits and in the rest
    logits (-1 where the other one or nothing predicts it). Token t >= 1 of row b is predicted
    by its position t - 1: in the prefix while t - 1 < start, else the rest call's
    position t - 1 - start."""
    b = len(plan.lengths_B)
    prefix_src_BT = torch.full((b, t), -1, dtype=torch.long)
    rest_src_BT = torch.full((b, t), -1, dtype=torch.long)
    for row, (g, start, n) in enumerate(
        zip(plan.group_B, plan.start_B, plan.lengths_B, strict=True)
    ):
        if g >= 0 and start > 0:
            prefix_src_BT[row, 1 : start + 1] = prefix_at(g) + torch.arange(start)
        rest_src_BT[row, start + 1 : n] = rest_at(row) + torch.arange(n - start - 1)
    return prefix_src_BT, rest_src_BT


def _prefix_spans(plan: _Plan) -> list[tuple[int, int]]:
    """(row, width) of each prefix row; without groups (lockstep), row 0's first token, which
    no row attends to (its logits and KV still enter the graph, so backward runs it too)."""
    return [(group.rows[0], group.shared_tokens - 1) for group in plan.prefixes] or [(0, 1)]


def _run_padded(
    model: torch.nn.Module, batch: CollatedBatch, plan: _Plan
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    ids_BT, device = batch.input_ids_BT, batch.input_ids_BT.device
    spans = _prefix_spans(plan)
    k, b = len(spans), len(plan.lengths_B)
    w = max(width for _, width in spans)
    prefix_ids_KW = torch.zeros((k, w), dtype=torch.long, device=device)
    prefix_mask_KW = torch.zeros((k, w), dtype=torch.long, device=device)
    for g, (row, width) in enumerate(spans):
        prefix_ids_KW[g, :width] = ids_BT[row, :width]
        prefix_mask_KW[g, :width] = 1
    out = model(input_ids=prefix_ids_KW, attention_mask=prefix_mask_KW, use_cache=True)
    s = max(n - start for n, start in zip(plan.lengths_B, plan.start_B, strict=True))
    rest_ids_BS = torch.zeros((b, s), dtype=torch.long, device=device)
    mask_BWS = torch.zeros((b, w + s), dtype=torch.long, device=device)
    for row, (start, n) in enumerate(zip(plan.start_B, plan.lengths_B, strict=True)):
        rest_ids_BS[row, : n - start] = ids_BT[row, start:n]
        mask_BWS[row, :start] = 1  # its own prefix (start = 0 without one)
        mask_BWS[row, w : w + n - start] = 1
    pick_B = torch.tensor([max(g, 0) for g in plan.group_B], dtype=torch.long, device=device)
    layers: list[Any] = list(_output_cache(out).layers)
    past = DynamicCache(
        ddp_cache_data=[
            (layer.keys.index_select(0, pick_B), layer.values.index_select(0, pick_B))
            for layer in layers
        ]
    )
    start_B1 = torch.tensor(plan.start_B, dtype=torch.long, device=device)[:, None]
    rest = model(
        input_ids=rest_ids_BS,
        attention_mask=mask_BWS,
        position_ids=start_B1 + torch.arange(s, device=device),
        use_cache=True,
        **{_cache_kwarg(model): past},
    )
    prefix_src_BT, rest_src_BT = _sources(
        plan, ids_BT.shape[1], lambda g: g * w, lambda row: row * s
    )
    return (
        out.logits.reshape(k * w, -1),
        prefix_src_BT.to(device),
        rest.logits.reshape(b * s, -1),
        rest_src_BT.to(device),
    )


def _run_packed(
    model: torch.nn.Module, batch: CollatedBatch, plan: _Plan
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    ids_BT, device = batch.input_ids_BT, batch.input_ids_BT.device
    spans = _prefix_spans(plan)
    prefix_at = [0]
    for _, width in spans:
        prefix_at.append(prefix_at[-1] + width)
    p = prefix_at[-1]
    prefix_ids = [ids_BT[row, :width] for row, width in spans]
    prefix_pos = [torch.arange(len(part), device=device) for part in prefix_ids]
    sees_PP = torch.zeros((p, p), dtype=torch.bool, device=device)
    for lo, hi in itertools.pairwise(prefix_at):
        sees_PP[lo:hi, lo:hi] = _causal(hi - lo, device)
    out = model(
        input_ids=torch.cat(prefix_ids)[None],
        position_ids=torch.cat(prefix_pos)[None],
        attention_mask=_attention_mask(model, sees_PP),
        use_cache=True,
    )
    rest_at = [0]
    for start, n in zip(plan.start_B, plan.lengths_B, strict=True):
        rest_at.append(rest_at[-1] + n - start)
    r = rest_at[-1]
    sees_RPR = torch.zeros((r, p + r), dtype=torch.bool, device=device)
    rest_ids, rest_pos = [], []
    for row, (g, start, n) in enumerate(
        zip(plan.group_B, plan.start_B, plan.lengths_B, strict=True)
    ):
        lo, hi = rest_at[row], rest_at[row + 1]
        rest_ids.append(ids_BT[row, start:n])
        rest_pos.append(torch.arange(start, n, device=device))
        if g >= 0:
            sees_RPR[lo:hi, prefix_at[g] : prefix_at[g + 1]] = True
        sees_RPR[lo:hi, p + lo : p + hi] = _causal(hi - lo, device)
    rest = model(
        input_ids=torch.cat(rest_ids)[None],
        position_ids=torch.cat(rest_pos)[None],
        attention_mask=_attention_mask(model, sees_RPR),
        use_cache=True,
        **{_cache_kwarg(model): _output_cache(out)},
    )
    prefix_src_BT, rest_src_BT = _sources(
        plan, ids_BT.shape[1], lambda g: prefix_at[g], lambda row: rest_at[row]
    )
    return (
        out.logits[0],
        prefix_src_BT.to(device),
        rest.logits[0],
        rest_src_BT.to(device),
    )


def _cache_kwarg(model: torch.nn.Module) -> str:
    """`cache` or `past_key_values`, from the forward of the model under any wrapper (PEFT)."""
    wrapper: Any = model
    return cache_kwarg(wrapper.get_base_model() if hasattr(wrapper, "get_base_model") else wrapper)


def _output_cache(out: Any) -> DynamicCache:
    """The KV cache of a model output (`cache` from transformers 5.x, `past_key_values` before)."""
    return out["cache"] if "cache" in out else out["past_key_values"]


def _causal(n: int, device: torch.device) -> torch.Tensor:
    return torch.ones((n, n), dtype=torch.bool, device=device).tril()


def _attention_mask(model: torch.nn.Module, sees_RK: torch.Tensor) -> torch.Tensor:
    """The 4D mask [1, 1, R, K] in the form the model's attention takes: bool for SDPA, 0 /
    dtype-min added to the scores for eager attention."""
    attention = getattr(model.config, "_attn_implementation", None) or "eager"
    if attention == "sdpa":
        return sees_RK[None, None]
    weights_dtype = next(model.parameters()).dtype
    blocked = torch.finfo(weights_dtype).min
    mask_RK = torch.zeros(sees_RK.shape, dtype=weights_dtype, device=sees_RK.device)
    return mask_RK.masked_fill(~sees_RK, blocked)[None, None]

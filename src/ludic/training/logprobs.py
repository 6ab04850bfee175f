"""Token logprobs (and entropies) of a causal LM, aligned with `LossInputs`:
`logprobs_BT[b, t] = log p(input_ids[b, t] | input_ids[b, :t])`, position 0 = 0.

p is the distribution each token was sampled from, as behaviour logprobs define it
(`ludic.types.BehaviorSampling`): softmax(logits / T) restricted to the top-k / top-p support
and renormalised, per token (`CollatedBatch.sampling`; None = temperature 1, no filter, the
plain log-softmax). The support is computed from the trainer's own logits, detached, with the
engine's own function (`ludic.inference.embedded.token_sampling`), so ties and the top-k-then-top-p
order match; the sampled token always stays in it (a token on the nucleus boundary may fall
outside when trainer and engine logits differ by rounding: its ratio then shows that
mismatch instead of -inf). The gradient flows through the renormalised log-softmax on that
support. Rows without top-k / top-p are never sorted. Entropies are of the same distribution
(as verl computes them on the tempered logits): an entropy bonus acts on the distribution the
ratio's logprobs come from, not on the temperature-1 one the sampler never drew from.

The logprob is `log_softmax(z).gather(token)`, the engine's own computation (not
`z[token] - logsumexp(z)`, which rounds differently): with `batch_invariant=True`,
`sequence_logprobs` computes the logits with the engine's batch-invariant arithmetic
(`ludic.training.invariant_forward`), and the logprobs then equal the batch-invariant embedded
engine's behaviour logprobs bit for bit on the same device and dtype.

Memory: the log-softmax is done chunk by chunk over positions in float32, so no extra
[B, T, V] copy of the logits is made (only [chunk, V] at a time, recomputed in backward when
it would otherwise be kept). It does not mask anything
beyond position 0 and padding; losses apply the action mask.

Shape legend: B = sequences, T = padded tokens, V = vocabulary, L = tokens of a packed row.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from ludic.inference.embedded.token_sampling import RowKnobs
from ludic.training.collate import CollatedBatch, TokenSampling, pack, shared_prefix_groups
from ludic.training.invariant_forward import invariant_logits

DEFAULT_CHUNK_TOKENS = 1024
_Knobs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # temperature_N, top_k_N, top_p_N


def processed_logits(
    x_CV: torch.Tensor,
    targets_C: torch.Tensor,
    temperature_C: torch.Tensor,
    top_k_C: torch.Tensor,
    top_p_C: torch.Tensor,
    filtered_rows: int,
) -> torch.Tensor:
    """Logits whose log-softmax is the sampled distribution: x / T, with -inf off the top-k /
    top-p support (computed detached from these logits, as the engine does; `targets_C` always
    kept). Only the `filtered_rows` rows with a filter on are sorted: the caller counts them
    (`_filtered_counts`), so nothing here reads a value on the host (a device sync per chunk,
    forward and recompute). Every row is divided by its temperature, 1 included: x / 1 is x
    and its gradient g / 1 is g, bit for bit, and one division costs less than asking the
    device whether any row needs it."""
    temperature_C = torch.where(temperature_C > 0, temperature_C, 1.0)  # greedy counts as 1
    x_CV = x_CV / temperature_C[:, None].to(x_CV.dtype)
    if filtered_rows == 0:
        return x_CV
    vocab = x_CV.shape[-1]
    # the filtered rows' indices, in order, without a host read: a stable sort puts them first
    # (torch.nonzero_static would too, but has no CUDA kernel before torch 2.6)
    off_C = (~_filtered(top_k_C, top_p_C, vocab)).to(torch.uint8)
    rows_R = torch.argsort(off_C, stable=True)[:filtered_rows]
    with torch.no_grad():
        top_p_R = top_p_C[rows_R].to(torch.float32)
        knobs = RowKnobs(  # RowKnobs.of would read the knobs on the host
            temperature_B=torch.ones_like(top_p_R),  # already scaled
            top_k_B=top_k_C[rows_R].to(torch.long),
            top_p_B=top_p_R,
            greedy_B=None,
            scaled=False,
            filtered=True,
        )
        support_RV = knobs.logprobs(x_CV[rows_R].detach()) > float("-inf")
        support_RV.scatter_(-1, targets_C[rows_R, None], True)
        drop_CV = torch.zeros(x_CV.shape, dtype=torch.bool, device=x_CV.device)
        drop_CV[rows_R] = ~support_RV
    return x_CV.masked_fill(drop_CV, float("-inf"))


def _filtered(top_k_N: torch.Tensor, top_p_N: torch.Tensor, vocab: int) -> torch.Tensor:
    """Which rows have top-k or top-p on (a top-k of the whole vocabulary is off)."""
    return ((top_k_N > 0) & (top_k_N < vocab)) | (top_p_N < 1)


def _filtered_counts(knobs_N: _Knobs, vocab: int, chunk_tokens: int) -> list[int]:
    """Rows with top-k / top-p on, per chunk of `chunk_tokens`. One host read per call, kept
    because it saves real work: a chunk without a filter (prompt tokens, temperature-only
    sampling) sorts nothing, and a chunk with some sorts only those rows, where a sync-free
    transform would sort every row of every chunk over the vocabulary, twice (recompute)."""
    filtered_N = _filtered(knobs_N[1], knobs_N[2], vocab)
    counts_K = torch.stack([f_C.sum() for f_C in torch.split(filtered_N, chunk_tokens)])
    return [int(n) for n in counts_K.tolist()]


def _chunk_terms(
    x_CV: torch.Tensor,
    targets_C: torch.Tensor,
    with_entropy: bool,
    temperature_C: torch.Tensor | None = None,
    top_k_C: torch.Tensor | None = None,
    top_p_C: torch.Tensor | None = None,
    filtered_rows: int | None = None,
) -> tuple[torch.Tensor, ...]:
    """(logprob_C,) or (logprob_C, entropy_C) of one chunk, computed in float32 (or float64),
    the logprobs under the sampling transform when one is given (`filtered_rows` of its rows
    with top-k / top-p on: counted here, one host read, where the caller did not count them)."""
    if x_CV.dtype != torch.float64:
        x_CV = x_CV.float()
    z_CV = x_CV
    if temperature_C is not None and top_k_C is not None and top_p_C is not None:
        if filtered_rows is None:
            filtered_rows = int(_filtered(top_k_C, top_p_C, x_CV.shape[-1]).sum())
        z_CV = processed_logits(x_CV, targets_C, temperature_C, top_k_C, top_p_C, filtered_rows)
    # log_softmax then gather: the engine's own computation, so equal logits give equal bits
    logprob_C = torch.log_softmax(z_CV, dim=-1).gather(-1, targets_C[:, None]).squeeze(-1)
    if not with_entropy:
        return (logprob_C,)
    return logprob_C, _entropy(z_CV)


def _entropy(z_CV: torch.Tensor) -> torch.Tensor:
    """H = -sum p log p = logsumexp(z) - sum p z of p = softmax(z), over the support: a -inf
    logit (off top-k / top-p) has p = 0 and adds nothing (0 * -inf would be nan). The fill
    runs on every chunk, -inf or not (a no-op on the values and gradients where there is
    none), instead of first asking whether any is there: that question waited for the
    device once per chunk, forward and recompute. The price: autograd keeps the filled
    [chunk, V] float32 copy for backward even without a -inf (chunking bounds it), and where
    a -inf is present the gradient is summed in another order than before (~1 ulp)."""
    logsumexp_C = torch.logsumexp(z_CV, dim=-1)
    p_CV = torch.softmax(z_CV, dim=-1)
    finite_CV = z_CV.masked_fill(z_CV == float("-inf"), 0.0)
    return logsumexp_C - (p_CV * finite_CV).sum(dim=-1)


def _next_token_logprobs(
    logits_NV: torch.Tensor,
    targets_N: torch.Tensor,
    with_entropy: bool,
    chunk_tokens: int,
    knobs_N: _Knobs | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(targets[i] | logits[i]) per row of a [N, V] tensor, chunk by chunk.

    Chunks come from `torch.split`, whose backward writes every chunk's gradient into one
    buffer (slicing each chunk instead would allocate a full-size gradient per chunk). Autograd
    would keep each chunk's float32 log-softmax (and casts, softmax, sampling transform), so
    the chunk is recomputed in backward instead (checkpointing): only the logits stay alive.
    """
    recompute = logits_NV.requires_grad  # the log-softmax output would stay alive otherwise
    logprobs, entropies = [], []
    split = [torch.split(logits_NV, chunk_tokens), torch.split(targets_N, chunk_tokens)]
    counts: list[int] = []
    if knobs_N is not None:
        split.extend(torch.split(k_N, chunk_tokens) for k_N in knobs_N)
        counts = _filtered_counts(knobs_N, logits_NV.shape[-1], chunk_tokens)
    for i, chunk in enumerate(zip(*split, strict=True)):
        args = (chunk[0], chunk[1], with_entropy, *chunk[2:])
        if counts:
            args += (counts[i],)
        if recompute:
            terms = checkpoint(_chunk_terms, *args, use_reentrant=False)
        else:
            terms = _chunk_terms(*args)
        logprobs.append(terms[0])
        if with_entropy:
            entropies.append(terms[1])
    return torch.cat(logprobs), (torch.cat(entropies) if with_entropy else None)


def token_logprobs(
    logits_BTV: torch.Tensor,
    input_ids_BT: torch.Tensor,
    *,
    with_entropy: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    sampling: TokenSampling | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs_BT, entropy_BT or None) from logits where `logits_BTV[b, t]` predicts token
    t + 1. Both are float32 (float64 for float64 logits) and 0 at position 0; `entropy_BT[b, t]`
    is the entropy of the distribution token t was drawn from. With `sampling` (aligned with
    `input_ids_BT`) token t's logprob and entropy are under its own sampling transform."""
    if logits_BTV.dim() != 3 or logits_BTV.shape[:2] != input_ids_BT.shape:
        raise ValueError(
            f"token_logprobs: logits {tuple(logits_BTV.shape)} do not match input_ids "
            f"{tuple(input_ids_BT.shape)}; expected logits [B, T, V] for input_ids [B, T]"
        )
    b, t, v = logits_BTV.shape
    dtype = torch.float64 if logits_BTV.dtype == torch.float64 else torch.float32
    zeros_B1 = torch.zeros((b, 1), dtype=dtype, device=logits_BTV.device)
    # Every position predicts the next token; the last one's (a dummy target) is dropped.
    # All B*T rows at once: a view of the logits, no per-sequence slicing.
    targets_BT = torch.cat([input_ids_BT[:, 1:], torch.zeros_like(input_ids_BT[:, :1])], dim=1)
    knobs_N: _Knobs | None = None
    if sampling is not None:
        knobs_N = (
            _next(sampling.temperature_BT, 1.0),
            _next(sampling.top_k_BT, -1),
            _next(sampling.top_p_BT, 1.0),
        )
    lp_N, h_N = _next_token_logprobs(
        logits_BTV.reshape(b * t, v), targets_BT.reshape(b * t), with_entropy, chunk_tokens, knobs_N
    )

    def shifted(values_N: torch.Tensor) -> torch.Tensor:
        return torch.cat([zeros_B1, values_N.view(b, t)[:, :-1]], dim=1)

    return shifted(lp_N), (None if h_N is None else shifted(h_N))


def _next(values_BT: torch.Tensor, identity: float) -> torch.Tensor:
    """[B*T] values of the token each position predicts (position t: token t + 1)."""
    pad_B1 = torch.full_like(values_BT[:, :1], identity)
    return torch.cat([values_BT[:, 1:], pad_B1], dim=1).reshape(-1)


def _packed_sampling(batch: CollatedBatch, index_BT: torch.Tensor) -> TokenSampling | None:
    """`batch.sampling` laid out like the packed row (identity nowhere else)."""
    sampling = batch.sampling
    if sampling is None:
        return None
    real_BT = batch.attention_mask_BT > 0
    where_R = index_BT[real_BT]
    length = int(where_R.max().item()) + 1 if where_R.numel() else 1

    def lay(values_BT: torch.Tensor, identity: float) -> torch.Tensor:
        row_1L = torch.full((1, length), identity, dtype=values_BT.dtype, device=values_BT.device)
        row_1L[0, where_R] = values_BT[real_BT]
        return row_1L

    return TokenSampling(
        temperature_BT=lay(sampling.temperature_BT, 1.0),
        top_k_BT=lay(sampling.top_k_BT, -1),
        top_p_BT=lay(sampling.top_p_BT, 1.0),
    )


def _real_tokens(values_BT: torch.Tensor, attention_mask_BT: torch.Tensor) -> torch.Tensor:
    return torch.where(attention_mask_BT > 0, values_BT, torch.zeros_like(values_BT))


def sequence_logprobs(
    model: torch.nn.Module,
    batch: CollatedBatch,
    *,
    packed: bool = False,
    with_entropy: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    batch_invariant: bool = False,
    shared_prefix_min_tokens: int | None = None,
    shared_path: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run a Hugging Face causal LM on `batch` and return (logprobs_BT, entropy_BT or None),
    0 on padding, logprobs under each token's sampling transform (`batch.sampling`). With
    `packed=True` the sequences go through the model as one row (position ids restart per
    sequence) and the results are laid back out as [B, T]. With `batch_invariant=True` the
    logits come from the batch-invariant engine's arithmetic (`invariant_logits`; not with
    `packed`), so an on-policy sample from that engine gets its behaviour logprobs back exactly.

    With `shared_prefix_min_tokens`, rows whose prompt is the same and who share at least that
    many leading tokens run them once (`ludic.training.shared_prefix`; same results within
    rounding) when that computes fewer tokens and the model supports it
    (`shared_prefix.takes_shared_path`); otherwise, and in batch-invariant mode, the per-row
    path runs. `shared_path` overrides that local choice with one all ranks agreed on
    (data-parallel training: FSDP gathers weights per model call, so every rank must make
    the same calls): True runs the shared path even with no group (a one-token prefix nobody
    attends to), False the per-row path."""
    if batch_invariant and packed:
        raise ValueError(
            "batch-invariant logprobs run each sequence as its own row: turn packing off"
        )
    if shared_prefix_min_tokens is not None and not batch_invariant:
        from ludic.training import shared_prefix  # imports this module

        groups = shared_prefix_groups(batch, min_tokens=shared_prefix_min_tokens)
        if shared_path is None:
            shared_path = shared_prefix.takes_shared_path(model, batch, groups, packed=packed)
        if shared_path:
            return shared_prefix.shared_prefix_logprobs(
                model,
                batch,
                groups,
                packed=packed,
                with_entropy=with_entropy,
                chunk_tokens=chunk_tokens,
                lockstep=True,
            )
    elif shared_path:
        raise ValueError("sequence_logprobs: shared_path=True needs shared_prefix_min_tokens")
    if not packed:
        if batch_invariant:
            logits_BTV = invariant_logits(model, batch.input_ids_BT, batch.attention_mask_BT)
        else:
            logits_BTV = model(
                input_ids=batch.input_ids_BT,
                attention_mask=batch.attention_mask_BT,
                use_cache=False,
            ).logits
        logprobs_BT, entropy_BT = token_logprobs(
            logits_BTV,
            batch.input_ids_BT,
            with_entropy=with_entropy,
            chunk_tokens=chunk_tokens,
            sampling=batch.sampling,
        )
        mask_BT = batch.attention_mask_BT
        return _real_tokens(logprobs_BT, mask_BT), (
            None if entropy_BT is None else _real_tokens(entropy_BT, mask_BT)
        )
    row = pack(batch)
    logits_1LV = model(
        input_ids=row.input_ids_1L, position_ids=row.position_ids_1L, use_cache=False
    ).logits
    logprobs_1L, entropy_1L = token_logprobs(
        logits_1LV,
        row.input_ids_1L,
        with_entropy=with_entropy,
        chunk_tokens=chunk_tokens,
        sampling=_packed_sampling(batch, row.index_BT),
    )
    # A sequence's first token is predicted from the previous sequence: drop it like position 0.
    keep_BT = batch.attention_mask_BT.clone()
    keep_BT[:, 0] = 0
    logprobs_BT = _real_tokens(logprobs_1L[0][row.index_BT], keep_BT)
    if entropy_1L is None:
        return logprobs_BT, None
    return logprobs_BT, _real_tokens(entropy_1L[0][row.index_BT], keep_BT)

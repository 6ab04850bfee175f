"""Token logprobs (and entropies) of a causal LM, aligned with `LossInputs`:
`logprobs_BT[b, t] = log p(input_ids[b, t] | input_ids[b, :t])`, position 0 = 0.

Memory: the log-softmax is done chunk by chunk over positions in float32, so no extra
[B, T, V] copy of the logits is made (only [chunk, V] at a time, recomputed in backward when
it would otherwise be kept). It does not mask anything
beyond position 0 and padding; losses apply the action mask.

Shape legend: B = sequences, T = padded tokens, V = vocabulary, L = tokens of a packed row.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from ludic.training.collate import CollatedBatch, pack

DEFAULT_CHUNK_TOKENS = 1024


def _chunk_terms(
    x_CV: torch.Tensor, targets_C: torch.Tensor, with_entropy: bool
) -> tuple[torch.Tensor, ...]:
    """(logprob_C,) or (logprob_C, entropy_C) of one chunk, computed in float32 (or float64)."""
    if x_CV.dtype != torch.float64:
        x_CV = x_CV.float()
    lse_C = torch.logsumexp(x_CV, dim=-1)
    logprob_C = x_CV.gather(-1, targets_C[:, None]).squeeze(-1) - lse_C
    if not with_entropy:
        return (logprob_C,)
    # H = -sum p log p = logsumexp(x) - sum p x
    return logprob_C, lse_C - (torch.softmax(x_CV, dim=-1) * x_CV).sum(dim=-1)


def _next_token_logprobs(
    logits_NV: torch.Tensor, targets_N: torch.Tensor, with_entropy: bool, chunk_tokens: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(targets[i] | logits[i]) per row of a [N, V] tensor, chunk by chunk.

    Chunks come from `torch.split`, whose backward writes every chunk's gradient into one
    buffer (slicing each chunk instead would allocate a full-size gradient per chunk). When
    autograd would otherwise keep a float32 copy of the chunk (low-precision logits, or the
    softmax of the entropy) the chunk is recomputed in backward instead (checkpointing), so
    only the logits themselves stay alive.
    """
    recompute = logits_NV.requires_grad and (
        with_entropy or logits_NV.dtype not in (torch.float32, torch.float64)
    )
    logprobs, entropies = [], []
    chunks = zip(
        torch.split(logits_NV, chunk_tokens), torch.split(targets_N, chunk_tokens), strict=True
    )
    for args in chunks:
        if recompute:
            terms = checkpoint(_chunk_terms, *args, with_entropy, use_reentrant=False)
        else:
            terms = _chunk_terms(*args, with_entropy)
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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs_BT, entropy_BT or None) from logits where `logits_BTV[b, t]` predicts token
    t + 1. Both are float32 (float64 for float64 logits) and 0 at position 0; `entropy_BT[b, t]`
    is the entropy of the distribution that token t was drawn from."""
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
    lp_N, h_N = _next_token_logprobs(
        logits_BTV.reshape(b * t, v), targets_BT.reshape(b * t), with_entropy, chunk_tokens
    )

    def shifted(values_N: torch.Tensor) -> torch.Tensor:
        return torch.cat([zeros_B1, values_N.view(b, t)[:, :-1]], dim=1)

    return shifted(lp_N), (None if h_N is None else shifted(h_N))


def _real_tokens(values_BT: torch.Tensor, attention_mask_BT: torch.Tensor) -> torch.Tensor:
    return torch.where(attention_mask_BT > 0, values_BT, torch.zeros_like(values_BT))


def sequence_logprobs(
    model: torch.nn.Module,
    batch: CollatedBatch,
    *,
    packed: bool = False,
    with_entropy: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run a Hugging Face causal LM on `batch` and return (logprobs_BT, entropy_BT or None),
    0 on padding. With `packed=True` the sequences go through the model as one row (position
    ids restart per sequence) and the results are laid back out as [B, T]."""
    if not packed:
        logits_BTV = model(
            input_ids=batch.input_ids_BT, attention_mask=batch.attention_mask_BT, use_cache=False
        ).logits
        logprobs_BT, entropy_BT = token_logprobs(
            logits_BTV, batch.input_ids_BT, with_entropy=with_entropy, chunk_tokens=chunk_tokens
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
        logits_1LV, row.input_ids_1L, with_entropy=with_entropy, chunk_tokens=chunk_tokens
    )
    # A sequence's first token is predicted from the previous sequence: drop it like position 0.
    keep_BT = batch.attention_mask_BT.clone()
    keep_BT[:, 0] = 0
    logprobs_BT = _real_tokens(logprobs_1L[0][row.index_BT], keep_BT)
    if entropy_1L is None:
        return logprobs_BT, None
    return logprobs_BT, _real_tokens(entropy_1L[0][row.index_BT], keep_BT)

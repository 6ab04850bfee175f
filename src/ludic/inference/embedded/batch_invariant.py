"""Batch-invariant pieces of the lean forward: each row's result does not depend on the other rows.

A row's logits are bit for bit the same whether it runs alone or in a batch of 32, at any slot,
next to rows of any length, admitted early or late. Two things break that in a plain batched
forward, measured on the tiny model with MKL on x86 (AVX-512):

- GEMMs: MKL computes a row of `x @ W.T` with different kernels (and so different rounding) for
  1, 2-3 and >= 4 rows (with 2 threads also 5-7 and 9-11); from 12 rows on, each row's result
  is the same for every row count and every position in the batch. `linear` pads the rows to
  `MIN_ROWS` and always uses `x @ W.T` (never the transposed form, which switches kernels at a
  different row count). `gemm_problem` re-checks this on the machine at hand, at start-up.
- Attention: SDPA over a left-padded KV cache sums each row's keys in blocks and vector lanes
  counted from the first padded column, so the padding that other rows impose changes the
  rounding; and with 2 threads it splits a batch of rows differently from one row. `attention`
  runs SDPA once per row over that row's own keys, with no padding and no mask beyond the row's
  own causal one.

Elementwise ops, RMSNorm, rotary, log-softmax and the per-row sampling are row-wise already.
What is not covered: a token's KV computed in a prefill and the same token's KV computed in a
decode step differ in the last bits (different attention shapes), so the engine turns prefix
reuse off in this mode; GPUs are not claimed (`gemm_problem` decides there too).

Legend: B rows, S new positions, T cached + new positions, H heads, K kv heads, D head dim,
N rows of a GEMM, E input features, O output features.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MIN_ROWS = 16
_PROBE_ROWS = (MIN_ROWS, MIN_ROWS + 1, 2 * MIN_ROWS + 3, 64, 129, 200)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`x @ weight.T (+ bias)` over the last dim, computed on at least `MIN_ROWS` rows (zero rows
    appended), so each row's result does not depend on how many rows there are."""
    x_NE = x.reshape(-1, x.shape[-1])
    rows = x_NE.shape[0]
    if rows < MIN_ROWS:
        x_NE = F.pad(x_NE, (0, 0, 0, MIN_ROWS - rows))
    y_NO = F.linear(x_NE, weight, bias)[:rows]
    return y_NO.reshape(*x.shape[:-1], y_NO.shape[-1])


def own_lengths(key_mask_BT: torch.Tensor, S: int) -> list[tuple[int, int]]:
    """Per row: (its real keys, its real new positions). Each row's real keys must be the last
    columns of the cache, one contiguous run (the engine keeps them so when prefix reuse is
    off); anything else is refused rather than computed over the wrong keys."""
    T = key_mask_BT.shape[1]
    mask_BT = key_mask_BT.bool()
    keys_B = mask_BT.sum(-1)
    first_B = torch.where(mask_BT.any(-1), mask_BT.int().argmax(-1), T)
    if not torch.equal(keys_B, T - first_B):
        raise ValueError(
            "batch-invariant attention needs each row's keys as one run at the end of the cache "
            "(prefix reuse leaves gaps): build the engine with prefix_cache_tokens=0"
        )
    return [(keys, min(keys, S)) for keys in keys_B.tolist()]


def attention(
    q_BHSD: torch.Tensor,
    k_BKTD: torch.Tensor,
    v_BKTD: torch.Tensor,
    lengths: list[tuple[int, int]],
    scale: float,
) -> torch.Tensor:
    """SDPA of each row's real new positions over its own keys (causal, aligned at the end), one
    call per row; padding positions get zeros."""
    B, H, S, D = q_BHSD.shape
    T, gqa = k_BKTD.shape[-2], k_BKTD.shape[1] != H
    out_BHSD = q_BHSD.new_zeros(B, H, S, D)
    for row, (keys, news) in enumerate(lengths):
        if not news:
            continue
        q = q_BHSD[row : row + 1, :, S - news :]
        k, v = k_BKTD[row : row + 1, :, T - keys :], v_BKTD[row : row + 1, :, T - keys :]
        mask = None
        if news > 1:  # new position i sees keys up to keys - news + i
            mask = torch.ones(news, keys, dtype=torch.bool, device=q.device).tril(keys - news)
        out_BHSD[row, :, S - news :] = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa
        )[0]
    return out_BHSD


def attention_problem(heads: int, kv_heads: int, head_dim: int, like: torch.Tensor) -> str | None:
    """None if `attention` gives rows of a batch (of mixed lengths) the bits they get alone."""
    generator = torch.Generator().manual_seed(0)
    B, T = 8, 40
    shapes = ((B, heads, 1, head_dim), (B, kv_heads, T, head_dim), (B, kv_heads, T, head_dim))
    q, k, v = (torch.randn(s, generator=generator).to(like) for s in shapes)
    lengths = [(T - 3 * row, 1) for row in range(B)]
    together = attention(q, k, v, lengths, 0.125)
    for row, (keys, _) in enumerate(lengths):
        own = (q[row : row + 1], k[row : row + 1, :, T - keys :], v[row : row + 1, :, T - keys :])
        if not torch.equal(attention(*own, [(keys, 1)], 0.125), together[row : row + 1]):
            return f"attention gives a row different bits in a batch than alone ({like.device})"
    return None


def gemm_problem(weights: list[torch.Tensor]) -> str | None:
    """None if `linear` gives every row the same bits at every probed row count (and slot) for
    each of `weights` on this machine, with the current torch thread count; else what differs."""
    generator = torch.Generator().manual_seed(0)
    for weight in weights:
        rows = max(_PROBE_ROWS)
        x_NE = torch.randn(rows, weight.shape[1], generator=generator).to(weight)
        alone_NO = torch.cat([linear(x_NE[i : i + 1], weight, None) for i in range(rows)])
        for n in _PROBE_ROWS:
            shifted = linear(x_NE[rows - n :], weight, None)  # other rows, other slots
            if not torch.equal(linear(x_NE[:n], weight, None), alone_NO[:n]) or not torch.equal(
                shifted, alone_NO[rows - n :]
            ):
                return (
                    f"a {tuple(weight.shape)} GEMM gives a row different bits in a batch of {n} "
                    f"than alone on this machine ({weight.device}, "
                    f"{torch.get_num_threads()} threads)"
                )
    return None

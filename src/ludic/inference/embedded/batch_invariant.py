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
  rounding; with 2 threads it splits a batch of rows differently from one row; and a query
  in a prefill (many query rows) rounds differently from the same query in a decode step.
  `attend` fixes every reduction order by the row's own keys: scores are GEMMs on at least
  `ATTENTION_MIN_ROWS` query rows (a score does not depend on its column), the max is exact,
  and the softmax sums run over blocks of `KEY_BLOCK` keys counted from the row's first key,
  one fixed-shape GEMM per block, added in order; unseen keys weigh exactly 0. A position thus
  gets the same bits alone or in a batch, in a prefill or a decode step, from a reused prefix,
  and in the trainer's full forward (`ludic.training.invariant_forward`), which is what makes
  trainer and engine logprobs equal bit for bit. `KeyLayout` finds each row's keys in the
  engine's cache (left padding, gaps after a reused prefix) once per forward.

Elementwise ops, RMSNorm, rotary, log-softmax and the per-row sampling are row-wise already.
`gemm_problem` and `attention_problem` re-check all this on the machine at hand, at start-up.
On a GPU, cuBLAS also picks kernels by row count past `MIN_ROWS` (an H100 gave a row other bits
in a GEMM of 17 rows than of 16), so there `linear` runs every GEMM on exactly `MIN_ROWS` rows;
with that the checks and the trainer's bit-for-bit recomputation passed on an H100 (2026-11-27).

Legend: B rows, S new positions, T cached + new positions, H heads, K kv heads, D head dim,
R query rows per kv head, W key columns from each row's first key, C keys of a block,
N rows of a GEMM, E input features, O output features.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

MIN_ROWS = 16
KEY_BLOCK = 128  # keys per block of the attention sums (`attend`)
ATTENTION_MIN_ROWS = 4  # query rows of an attention GEMM (fewer take another kernel)
_PROBE_ROWS = (MIN_ROWS, MIN_ROWS + 1, 2 * MIN_ROWS + 3, 64, 129, 200)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`x @ weight.T (+ bias)` over the last dim, computed on at least `MIN_ROWS` rows (zero rows
    appended), so each row's result does not depend on how many rows there are. On a GPU every
    GEMM runs on exactly `MIN_ROWS` rows, chunk after chunk (cuBLAS picks kernels by row count
    past that too)."""
    x_NE = x.reshape(-1, x.shape[-1])
    rows = x_NE.shape[0]
    missing = -rows % MIN_ROWS if x_NE.is_cuda else max(0, MIN_ROWS - rows)
    if missing:
        x_NE = F.pad(x_NE, (0, 0, 0, missing))
    if x_NE.is_cuda:
        y_NO = torch.cat([F.linear(x_CE, weight, bias) for x_CE in x_NE.split(MIN_ROWS)])[:rows]
    else:
        y_NO = F.linear(x_NE, weight, bias)[:rows]
    return y_NO.reshape(*x.shape[:-1], y_NO.shape[-1])


@dataclass(frozen=True, slots=True)
class KeyLayout:
    """Where each row's keys lie in a KV cache of T columns (padded rows, gaps after a reused
    prefix), worked out once per forward: `columns_BW` lists them in order from the row's first
    key (width a multiple of `KEY_BLOCK`; past the row's keys it repeats the last one, never
    seen), `index_N` the same rows of the cache flattened to [B * K * T, D], kv head by kv
    head, and `last_BS` the last key (counted from the row's first) each new position sees:
    its own."""

    columns_BW: torch.Tensor
    index_N: torch.Tensor
    last_BS: torch.Tensor
    aligned: bool = False  # every column is a real key: nothing to move

    @classmethod
    def of(cls, key_mask_BT: torch.Tensor, S: int, kv_heads: int) -> KeyLayout:
        """From the key mask over the cache and the S new positions (its last S columns); a
        row's real keys may lie in several runs (a reused prefix, padding, then the rest)."""
        mask_BT = key_mask_BT.bool()
        B, T = mask_BT.shape
        keys_B = mask_BT.sum(-1)
        width = max(1, -(-int(keys_B.max()) // KEY_BLOCK)) * KEY_BLOCK
        real_first_BT = torch.sort((~mask_BT).to(torch.uint8), dim=-1, stable=True).indices
        at_BW = torch.arange(width, device=mask_BT.device).expand(B, width)
        at_BW = torch.minimum(at_BW, (keys_B - 1).clamp(min=0)[:, None]).clamp(max=T - 1)
        columns_BW = real_first_BT.gather(-1, at_BW)
        rows_BK = torch.arange(B * kv_heads, device=mask_BT.device).view(B, kv_heads) * T
        index_N = (rows_BK[:, :, None] + columns_BW[:, None, :]).reshape(-1)
        # a new position's key counts the row's real keys up to it
        last_BS = (mask_BT.long().cumsum(-1) - 1)[:, T - S :].clamp(min=0)
        aligned = bool(mask_BT.all())
        return cls(columns_BW=columns_BW, index_N=index_N, last_BS=last_BS, aligned=aligned)

    @classmethod
    def contiguous(
        cls, keys: list[int], S: int, T: int, kv_heads: int, device: torch.device | str = "cpu"
    ) -> KeyLayout:
        """Each row's `keys` real keys as one run at the end of a cache of T columns."""
        mask_BT = torch.arange(T, device=device) >= T - torch.tensor(keys, device=device)[:, None]
        return cls.of(mask_BT, S, kv_heads)


def attention(
    q_BHSD: torch.Tensor,
    k_BKTD: torch.Tensor,
    v_BKTD: torch.Tensor,
    layout: KeyLayout,
    scale: float,
) -> torch.Tensor:
    """The engine's attention over a left-padded KV cache: `attend`'s arithmetic, with the scores
    computed where the keys lie (a score does not depend on its column) and then, with the
    values, moved to start at each row's first key (`layout`). Padding positions get finite
    values that nothing reads. -> [B, H, S, D]."""
    B, H, S, D = q_BHSD.shape
    K, T = k_BKTD.shape[1], k_BKTD.shape[2]
    group = H // K  # q head h reads kv head h // group
    q_BKRD, last_BR = _rows(q_BHSD.reshape(B, K, group * S, D), layout.last_BS.repeat(1, group))
    rows, width = q_BKRD.shape[2], layout.columns_BW.shape[1]
    # a GEMM with few columns takes other kernels: at least KEY_BLOCK (the extra ones unread)
    keys_BKTD = F.pad(k_BKTD, (0, 0, 0, KEY_BLOCK - T)) if T < KEY_BLOCK else k_BKTD
    scores_BKRT = torch.matmul(q_BKRD, keys_BKTD.transpose(-1, -2)) * scale
    if layout.aligned:  # keys already start at column 0 (one row, or rows filling the cache)
        out_BKRD = _weighted_sum(scores_BKRT[..., :T], last_BR, v_BKTD)
        return out_BKRD[:, :, : group * S].reshape(B, H, S, D)
    columns_BKRW = layout.columns_BW[:, None, None, :].expand(B, K, rows, width)
    scores_BKRW = scores_BKRT.gather(-1, columns_BKRW)
    v_BKWD = v_BKTD.reshape(B * K * T, D).index_select(0, layout.index_N).view(B, K, width, D)
    out_BKRD = _weighted_sum(scores_BKRW, last_BR, v_BKWD)
    return out_BKRD[:, :, : group * S].reshape(B, H, S, D)


def grouped_attention(
    q_BHSD: torch.Tensor,
    k_BKTD: torch.Tensor,
    v_BKTD: torch.Tensor,
    last_BS: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """`attend` with the query heads grouped under their kv head (GQA): position s of row b sees
    keys 0..last_BS[b, s] (keys aligned at column 0). -> [B, H, S, D]."""
    B, H, S, D = q_BHSD.shape
    K = k_BKTD.shape[1]
    group = H // K  # q head h reads kv head h // group
    q_BKRD = q_BHSD.reshape(B, K, group * S, D)  # rows: (head in group, position)
    out_BKRD = attend(q_BKRD, k_BKTD, v_BKTD, last_BS.repeat(1, group), scale)
    return out_BKRD.reshape(B, H, S, D)


def attend(
    q_BKRD: torch.Tensor,
    k_BKTD: torch.Tensor,
    v_BKTD: torch.Tensor,
    last_BR: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Softmax attention of query row r over keys 0..last_BR[b, r] (keys aligned at column 0),
    with every reduction in an order fixed by the row's own keys alone: scores are one GEMM per
    (row, kv head) over at least `ATTENTION_MIN_ROWS` query rows (each score a dot product over
    D, whatever its column); the max is exact; the weighted sums and the normaliser run over
    blocks of `KEY_BLOCK` keys counted from key 0, one fixed-shape GEMM (and sum) per block,
    added block after block. Keys a query does not see weigh exactly 0, so extra keys or blocks
    after them (a longer sequence, a padded batch) and extra query rows change no bit of its
    output: a prefill, a decode step and the trainer's full forward give a position the same
    result. Differentiable (the trainer backpropagates through it)."""
    R, T = q_BKRD.shape[2], k_BKTD.shape[2]
    q_BKRD, last_BR = _rows(q_BKRD, last_BR)
    # a GEMM with few columns takes other kernels: at least KEY_BLOCK (the extra ones unread)
    keys_BKTD = F.pad(k_BKTD, (0, 0, 0, KEY_BLOCK - T)) if T < KEY_BLOCK else k_BKTD
    scores_BKRT = torch.matmul(q_BKRD, keys_BKTD.transpose(-1, -2)) * scale
    return _weighted_sum(scores_BKRT[..., :T], last_BR, v_BKTD)[:, :, :R]


def _rows(q_BKRD: torch.Tensor, last_BR: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """At least `ATTENTION_MIN_ROWS` query rows (zeros appended, seeing key 0)."""
    R = q_BKRD.shape[2]
    if R >= ATTENTION_MIN_ROWS:
        return q_BKRD, last_BR
    extra = ATTENTION_MIN_ROWS - R
    return F.pad(q_BKRD, (0, 0, 0, extra)), F.pad(last_BR, (0, extra))


def _weighted_sum(
    scores_BKRW: torch.Tensor, last_BR: torch.Tensor, v_BKWD: torch.Tensor
) -> torch.Tensor:
    """softmax(scores over keys 0..last) @ v, keys aligned at column 0: block by block in a
    fixed order (see `attend`); a last, partial block is padded to `KEY_BLOCK` keys that weigh
    0 (only that block is copied)."""
    width = scores_BKRW.shape[-1]
    seen_B1RW = torch.arange(width, device=scores_BKRW.device) <= last_BR[:, None, :, None]
    scores_BKRW = scores_BKRW.masked_fill(~seen_B1RW, float("-inf"))
    max_BKR1 = scores_BKRW.detach().amax(-1, keepdim=True)
    total_BKRD = norm_BKR1 = None
    for start in range(0, width, KEY_BLOCK):
        scores_BKRC = scores_BKRW[..., start : start + KEY_BLOCK]
        v_BKCD = v_BKWD[:, :, start : start + KEY_BLOCK]
        if v_BKCD.shape[2] < KEY_BLOCK:
            missing = KEY_BLOCK - v_BKCD.shape[2]
            scores_BKRC = F.pad(scores_BKRC, (0, missing), value=float("-inf"))
            v_BKCD = F.pad(v_BKCD, (0, 0, 0, missing))
        weight_BKRC = torch.exp(scores_BKRC - max_BKR1)
        part_BKRD = torch.matmul(weight_BKRC, v_BKCD)
        part_BKR1 = weight_BKRC.sum(-1, keepdim=True)
        if total_BKRD is None or norm_BKR1 is None:
            total_BKRD, norm_BKR1 = part_BKRD, part_BKR1
        else:
            total_BKRD, norm_BKR1 = total_BKRD + part_BKRD, norm_BKR1 + part_BKR1
    assert total_BKRD is not None and norm_BKR1 is not None
    return total_BKRD / norm_BKR1


def attention_problem(heads: int, kv_heads: int, head_dim: int, like: torch.Tensor) -> str | None:
    """None if `attention` gives a position the same bits in a decode step, in a batch of rows
    of mixed lengths, in a prefill and in a longer (trainer-style) forward; else what differs."""
    generator = torch.Generator().manual_seed(0)
    B, T = 8, 2 * KEY_BLOCK + 40
    shapes = ((B, heads, 1, head_dim), (B, kv_heads, T, head_dim), (B, kv_heads, T, head_dim))
    q, k, v = (torch.randn(s, generator=generator).to(like) for s in shapes)
    lengths = [(T - 37 * row, 1) for row in range(B)]
    together = attention(
        q,
        k,
        v,
        KeyLayout.contiguous([keys for keys, _ in lengths], 1, T, kv_heads, like.device),
        0.125,
    )
    for row, (keys, _) in enumerate(lengths):
        own = (q[row : row + 1], k[row : row + 1, :, T - keys :], v[row : row + 1, :, T - keys :])
        alone = attention(*own, KeyLayout.contiguous([keys], 1, keys, kv_heads, like.device), 0.125)
        if not torch.equal(alone, together[row : row + 1]):
            return f"attention gives a row different bits in a batch than alone ({like.device})"
    short = attention(
        q[:1],
        k[:1, :, :5],
        v[:1, :, :5],
        KeyLayout.contiguous([3], 1, 5, kv_heads, like.device),
        0.125,
    )
    alone = attention(
        q[:1],
        k[:1, :, 2:5],
        v[:1, :, 2:5],
        KeyLayout.contiguous([3], 1, 3, kv_heads, like.device),
        0.125,
    )
    if not torch.equal(short, alone):
        return f"attention gives a short row different bits next to padding ({like.device})"
    # the last row's keys as a prefill of S positions, then as one longer causal row
    keys = lengths[-1][0]
    k_1KTD, v_1KTD = k[-1:, :, T - keys :], v[-1:, :, T - keys :]
    q_1HSD = torch.randn(1, heads, keys, head_dim, generator=generator).to(like)
    q_1HSD[:, :, -1:] = q[-1:]
    layout = KeyLayout.contiguous([keys], keys, keys, kv_heads, like.device)
    prefill = attention(q_1HSD, k_1KTD, v_1KTD, layout, 0.125)
    longer = torch.randn(1, kv_heads, KEY_BLOCK + 5, head_dim, generator=generator).to(like)
    k_long, v_long = torch.cat([k_1KTD, longer], 2), torch.cat([v_1KTD, longer], 2)
    q_long = torch.cat([q_1HSD, longer[:, :1].expand(1, heads, KEY_BLOCK + 5, head_dim)], 2)
    last = torch.arange(q_long.shape[2], device=like.device)[None]
    full = grouped_attention(q_long, k_long, v_long, last, 0.125)
    if not torch.equal(prefill, full[:, :, :keys]) or not torch.equal(
        prefill[:, :, -1:], together[-1:]
    ):
        return f"attention gives a position different bits in a prefill, a decode step and a longer forward ({like.device})"
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

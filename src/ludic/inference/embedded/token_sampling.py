"""Per-row token sampling with exact behaviour logprobs: temperature, top-k, top-p.

The processed distribution is softmax(top_p(top_k(logits / temperature))) with masked tokens at
-inf, the order vLLM and transformers use. Each row draws one uniform from its own generator per
step and samples by inverse CDF, so a seeded request gives the same tokens whatever else is in
the batch. Greedy rows (temperature 0) take the argmax. No repetition penalties, min-p or
logit bias.

Legend: B rows, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

LogprobsMode = Literal["processed", "raw"]


@dataclass(frozen=True, slots=True)
class RowKnobs:
    """A batch's per-row sampling knobs as tensors, and which processing steps any row needs:
    built once per batch composition, not per step. Temperature 0 (greedy) counts as 1 here
    (greedy rows report the model's own distribution)."""

    temperature_B: torch.Tensor
    top_k_B: torch.Tensor
    top_p_B: torch.Tensor
    greedy_B: torch.Tensor | None  # None when no row is greedy
    scaled: bool  # some row's temperature is not 1
    filtered: bool  # some row has top-k or top-p on

    @classmethod
    def of(
        cls,
        temperatures: Sequence[float],
        top_ks: Sequence[int],
        top_ps: Sequence[float],
        vocab: int,
        device: torch.device | str = "cpu",
    ) -> RowKnobs:
        greedy = [t == 0 for t in temperatures]
        temperature_B = torch.tensor([t if t > 0 else 1.0 for t in temperatures], device=device)
        top_k_B = torch.tensor(top_ks, dtype=torch.long, device=device)
        top_p_B = torch.tensor(top_ps, dtype=torch.float32, device=device)
        return cls(
            temperature_B=temperature_B,
            top_k_B=top_k_B,
            top_p_B=top_p_B,
            greedy_B=torch.tensor(greedy, device=device) if any(greedy) else None,
            scaled=bool((temperature_B != 1).any()),
            filtered=bool(((top_k_B > 0) & (top_k_B < vocab)).any() or (top_p_B < 1).any()),
        )

    def logprobs(self, logits_BV: torch.Tensor) -> torch.Tensor:
        """Log-softmax of the processed distribution each row samples from (float32)."""
        scaled_BV = logits_BV.float()
        if self.scaled:  # dividing by 1 changes nothing: skipped when no row needs it
            scaled_BV = scaled_BV / self.temperature_B[:, None]
        if self.filtered:
            scaled_BV = _filter_top_k_top_p(scaled_BV, self.top_k_B, self.top_p_B)
        return torch.log_softmax(scaled_BV, dim=-1)


def processed_logprobs(
    logits_BV: torch.Tensor,
    temperature_B: torch.Tensor,
    top_k_B: torch.Tensor,
    top_p_B: torch.Tensor,
) -> torch.Tensor:
    """Log-softmax of the processed distribution each row samples from (float32).

    temperature 0 counts as 1 here (greedy rows report the model's own distribution).
    top_k -1 and top_p 1 turn the filters off. At least one token always survives.
    """
    knobs = RowKnobs.of(
        temperature_B.tolist(), top_k_B.tolist(), top_p_B.tolist(), logits_BV.shape[-1]
    )
    return knobs.logprobs(logits_BV)


def _filter_top_k_top_p(
    scaled_BV: torch.Tensor, top_k_B: torch.Tensor, top_p_B: torch.Tensor
) -> torch.Tensor:
    vocab = scaled_BV.shape[-1]
    sorted_BV, order_BV = scaled_BV.sort(dim=-1, descending=True)
    rank_V = torch.arange(vocab, device=scaled_BV.device)
    k_B = torch.where(top_k_B > 0, top_k_B, torch.full_like(top_k_B, vocab))
    drop_BV = rank_V[None, :] >= k_B[:, None]
    sorted_BV = sorted_BV.masked_fill(drop_BV, float("-inf"))
    probs_BV = torch.softmax(sorted_BV, dim=-1)
    mass_before_BV = probs_BV.cumsum(dim=-1) - probs_BV
    # Rows with top_p 1 keep every token: their float mass can reach 1 before the tail, which
    # would drop tokens only when another row's top-p makes the batch filter at all.
    drop_BV = (mass_before_BV >= top_p_B[:, None]) & (top_p_B < 1)[:, None]
    drop_BV[:, 0] = False
    sorted_BV = sorted_BV.masked_fill(drop_BV, float("-inf"))
    return torch.empty_like(scaled_BV).scatter_(-1, order_BV, sorted_BV)


def draw_uniforms(generators: Sequence[torch.Generator]) -> torch.Tensor:
    """One uniform in [0, 1) per row, each from that row's own generator."""
    return torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in generators])


def sample_tokens(
    logprobs_BV: torch.Tensor, uniforms_B: torch.Tensor, greedy_B: torch.Tensor | None = None
) -> torch.Tensor:
    """Inverse-CDF sampling from `exp(logprobs_BV)`; argmax where `greedy_B`."""
    probs_BV = logprobs_BV.double().exp()
    cdf_BV = probs_BV.cumsum(dim=-1)
    targets_B1 = (uniforms_B.to(cdf_BV.device) * cdf_BV[:, -1]).unsqueeze(-1)
    sampled_B = torch.searchsorted(cdf_BV, targets_B1, right=True).squeeze(-1)
    sampled_B = sampled_B.clamp(max=logprobs_BV.shape[-1] - 1)
    # A token of probability 0 is never chosen, even at a float boundary of the CDF.
    argmax_B = logprobs_BV.gather(-1, sampled_B[:, None]).squeeze(-1) == float("-inf")
    if greedy_B is not None:
        argmax_B |= greedy_B.to(sampled_B.device)
    if not argmax_B.any():
        return sampled_B
    return torch.where(argmax_B, logprobs_BV.argmax(dim=-1), sampled_B)

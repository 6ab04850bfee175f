"""The trainer's forward in batch-invariant mode: logits computed exactly as the batch-invariant
embedded engine computes them, with autograd.

`invariant_logits(model, input_ids_BT, attention_mask_BT)` runs a Llama-family model (the ones
`ludic.inference.embedded.lean_forward` supports) over right-padded rows with the engine's own
arithmetic: the same RMSNorm, rotary table and rotation, q/k/v and gate/up projections as one
GEMM over the weights laid side by side (`torch.cat`, so gradients reach each module's weight),
`batch_invariant.linear` for every GEMM (each row's result independent of how many rows there
are) and `batch_invariant.grouped_attention`, whose result for a position depends only on that
position's query and the keys it sees, in a fixed block order. A position therefore gets the
same float32 bits here as in the engine's prefill or decode step, so on the same device and
dtype the recomputed logprobs equal the behaviour logprobs bit for bit (an on-policy ratio of
exactly 1). Gradients are autograd's through those same ops.

Not covered: packing (each sequence is its own row), FSDP-sharded or LoRA-wrapped models, and
models the lean forward does not run (a clear error names the reason). It is slower than the
transformers forward (blockwise attention, padded GEMMs) and keeps the [rows, keys] attention
scores per layer for backward.

Legend: B rows, T positions, N = B * T, H heads, K kv heads, C = H + 2K projected heads,
D head dim, E hidden size, I MLP width, V vocabulary.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F

from ludic.inference.embedded import batch_invariant as invariant
from ludic.inference.embedded.lean_forward import (
    _STATIC_ROPE_TYPES,
    _Layer,
    _rms_norm,
    _RotaryTable,
    _rotate,
    _signed_rotary,
    _unsupported,
)

_FORWARDS: weakref.WeakKeyDictionary[torch.nn.Module, InvariantForward] = (
    weakref.WeakKeyDictionary()
)


class InvariantForward:
    """`__call__(input_ids_BT, attention_mask_BT)` -> float32 logits [B, T, V] of right-padded
    rows (position t of a row predicts token t + 1), differentiable."""

    def __init__(self, model: torch.nn.Module) -> None:
        reason = _unsupported(model)  # type: ignore[arg-type]
        if reason is not None:
            raise ValueError(
                f"batch-invariant logprobs need a model the embedded engine's lean forward runs "
                f"({reason}); turn batch_invariant off for this model"
            )
        decoder: Any = model.model
        config: Any = model.config
        layers = decoder.layers[: config.num_hidden_layers]
        self.embed: Any = decoder.embed_tokens
        self.norm: Any = decoder.norm
        self.lm_head: Any = model.lm_head
        self.layers = [_Layer.of(layer) for layer in layers]
        attention = layers[0].self_attn
        self.head_dim = int(attention.head_dim)
        self.heads = int(attention.q_proj.weight.shape[0]) // self.head_dim
        self.kv_heads = int(attention.k_proj.weight.shape[0]) // self.head_dim
        self.scaling = float(attention.scaling)
        self.qk_norm = hasattr(attention, "q_norm")
        rotary = decoder.rotary_emb
        static = getattr(rotary, "rope_type", None) in _STATIC_ROPE_TYPES
        self.rotary = _RotaryTable(rotary) if static else _signed_rotary(rotary)
        self.act = F.silu if config.hidden_act == "silu" else layers[0].mlp.act_fn

    @classmethod
    def of(cls, model: torch.nn.Module) -> InvariantForward:
        """The forward for `model`, built once per model."""
        forward = _FORWARDS.get(model)
        if forward is None:
            forward = _FORWARDS[model] = cls(model)
        return forward

    def __call__(self, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor) -> torch.Tensor:
        real_BT = attention_mask_BT > 0
        if not bool((real_BT[:, 1:] <= real_BT[:, :-1]).all()):
            raise ValueError("batch-invariant logprobs need right-padded rows (real tokens first)")
        B, T = input_ids_BT.shape
        N, H, K, D = B * T, self.heads, self.kv_heads, self.head_dim
        positions_BT = torch.arange(T, device=input_ids_BT.device).expand(B, T)
        hidden_NE = F.embedding(input_ids_BT.reshape(N), self.embed.weight)
        cos_BTD, signed_sin_BTD = self.rotary(hidden_NE, positions_BT)
        cos_N1D, sin_N1D = cos_BTD.reshape(N, 1, D), signed_sin_BTD.reshape(N, 1, D)
        for layer in self.layers:
            x_NE = _rms_norm(hidden_NE, layer.input_norm)
            qkv_NCD = _side_by_side(x_NE, layer.qkv.modules).view(N, -1, D)
            if self.qk_norm:
                q_NHD = _rotate(_rms_norm(qkv_NCD[:, :H], layer.q_norm), cos_N1D, sin_N1D)
                k_NKD = _rotate(_rms_norm(qkv_NCD[:, H : H + K], layer.k_norm), cos_N1D, sin_N1D)
            else:  # q and k rotated together, as the engine does
                qk_NCD = _rotate(qkv_NCD[:, : H + K], cos_N1D, sin_N1D)
                q_NHD, k_NKD = qk_NCD[:, :H], qk_NCD[:, H:]
            q_BHTD = q_NHD.reshape(B, T, H, D).transpose(1, 2)
            k_BKTD = k_NKD.reshape(B, T, K, D).transpose(1, 2)
            v_BKTD = qkv_NCD[:, H + K :].reshape(B, T, K, D).transpose(1, 2)
            out_BHTD = invariant.grouped_attention(
                q_BHTD, k_BKTD, v_BKTD, positions_BT, self.scaling
            )
            out_NE = out_BHTD.transpose(1, 2).reshape(N, -1)
            hidden_NE = hidden_NE + _module_linear(out_NE, layer.o)
            gate_up_N2I = _side_by_side(
                _rms_norm(hidden_NE, layer.post_norm), layer.gate_up.modules
            )
            gate_NI, up_NI = gate_up_N2I.chunk(2, dim=-1)
            hidden_NE = hidden_NE + _module_linear(self.act(gate_NI) * up_NI, layer.down)
        logits_NV = _module_linear(_rms_norm(hidden_NE, self.norm), self.lm_head)
        return logits_NV.float().view(B, T, -1)


def invariant_logits(
    model: torch.nn.Module, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor
) -> torch.Tensor:
    """Float32 logits [B, T, V] of right-padded rows, bit for bit the batch-invariant engine's
    (`InvariantForward`)."""
    return InvariantForward.of(model)(input_ids_BT, attention_mask_BT)


def _module_linear(x: torch.Tensor, module: Any) -> torch.Tensor:
    params = module._parameters
    return invariant.linear(x, params["weight"], params["bias"])


def _side_by_side(x_NE: torch.Tensor, modules: tuple[Any, ...]) -> torch.Tensor:
    """The modules' outputs side by side from one GEMM over their weights (and biases) stacked,
    as the engine's fused projection computes them."""
    weight = torch.cat([m._parameters["weight"] for m in modules])
    biases = [m._parameters["bias"] for m in modules]
    bias = torch.cat(biases) if all(b is not None for b in biases) else None
    if bias is None and any(b is not None for b in biases):
        return torch.cat([_module_linear(x_NE, m) for m in modules], -1)
    return invariant.linear(x_NE, weight, bias)


__all__ = ["InvariantForward", "invariant_logits"]

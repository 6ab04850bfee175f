"""A lean forward pass for Llama-family decoders (Llama, Mistral, Qwen2, Qwen3), for the engine.

Calling a transformers model runs its module machinery (hooks, output capturing, per-step mask
building) around every layer: at decode time on a small model that costs more than the math
(the tiny model: ~5 ms per step at batch 1, of which ~0.5 ms is arithmetic). `LeanForward`
reads the model's own parameters (live: weight updates need no re-binding) and runs the same
arithmetic as a plain function: embed, per layer RMSNorm -> q/k/v (+ Qwen3's q/k norms) ->
rotary (the model's own rotary module, so every rope type works) -> the KV cache -> SDPA with
GQA -> o_proj, RMSNorm -> gated MLP, then the final norm and lm_head on the kept positions.

`LeanForward.for_model(model)` returns None for anything else, and also when a self-check (one
small padded forward compared with the model's own) disagrees, so an unexpected variant falls
back to the transformers forward instead of serving wrong logprobs.

Legend: B rows, S new positions, T cached + new positions, H heads, K kv heads, D head dim,
E hidden size, V vocabulary.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

logger = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_SELF_CHECK_ATOL = 1e-3


class LeanForward:
    """`__call__(ids_BS, key_mask_BT, positions_BS, cache, keep)` -> float logits of the last
    `keep` positions, [B, keep, V]; the cache grows by S positions like the model's own."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.dtype = model.dtype
        self.decoder: Any = model.model
        self.embed: Any = self.decoder.embed_tokens
        self.norm: Any = self.decoder.norm
        self.lm_head: Any = model.lm_head
        decoder_layers = self.decoder.layers[: model.config.num_hidden_layers]
        self.layers = [_Layer.of(layer) for layer in decoder_layers]
        attention = decoder_layers[0].self_attn
        self.head_dim = int(attention.head_dim)
        self.scaling = float(attention.scaling)
        self.qk_norm = hasattr(attention, "q_norm")
        act = decoder_layers[0].mlp.act_fn
        self.act = F.silu if model.config.hidden_act == "silu" else act

    @classmethod
    def for_model(cls, model: PreTrainedModel) -> LeanForward | None:
        """A LeanForward for `model`, or None (with the reason logged) when it does not apply."""
        reason = _unsupported(model)
        if reason is None:
            try:
                lean = cls(model)
            except AttributeError as e:
                reason = f"unexpected module layout ({e})"
            else:
                reason = lean._self_check()
                if reason is None:
                    return lean
        logger.info("embedded engine uses the transformers forward: %s", reason)
        return None

    @torch.inference_mode()
    def __call__(
        self,
        ids_BS: torch.Tensor,
        key_mask_BT: torch.Tensor,
        positions_BS: torch.Tensor,
        cache: DynamicCache,
        keep: int = 1,
    ) -> torch.Tensor:
        B, S = ids_BS.shape
        T = key_mask_BT.shape[1]
        hidden_BSE = F.embedding(ids_BS, self.embed.weight)
        attn_mask = _additive(_attention_mask(key_mask_BT.bool(), S), hidden_BSE.dtype)
        cos_BSD, sin_BSD = self.decoder.rotary_emb(hidden_BSE, positions_BS)
        cos_B1SD, sin_B1SD = cos_BSD[:, None], sin_BSD[:, None]
        for i, layer in enumerate(self.layers):
            x_BSE = _rms_norm(hidden_BSE, layer.input_norm)
            q_BSHD = _linear(x_BSE, layer.q).view(B, S, -1, self.head_dim)
            k_BSKD = _linear(x_BSE, layer.k).view(B, S, -1, self.head_dim)
            v_BKSD = _linear(x_BSE, layer.v).view(B, S, -1, self.head_dim).transpose(1, 2)
            if self.qk_norm:
                q_BSHD = _rms_norm(q_BSHD, layer.q_norm)
                k_BSKD = _rms_norm(k_BSKD, layer.k_norm)
            q_BHSD = _rotate(q_BSHD.transpose(1, 2), cos_B1SD, sin_B1SD)
            k_BKSD = _rotate(k_BSKD.transpose(1, 2), cos_B1SD, sin_B1SD)
            k_BKTD, v_BKTD = cast(DynamicLayer, cache.layers[i]).update(k_BKSD, v_BKSD)
            assert k_BKTD.shape[-2] == T, "the key mask must cover the cache and the new positions"
            out_BHSD = F.scaled_dot_product_attention(
                q_BHSD,
                k_BKTD,
                v_BKTD,
                attn_mask=attn_mask,
                scale=self.scaling,
                enable_gqa=q_BHSD.shape[1] != k_BKTD.shape[1],
            )
            out_BSE = out_BHSD.transpose(1, 2).reshape(B, S, -1)
            hidden_BSE = hidden_BSE + _linear(out_BSE, layer.o)
            x_BSE = _rms_norm(hidden_BSE, layer.post_norm)
            gated_BSE = self.act(_linear(x_BSE, layer.gate)) * _linear(x_BSE, layer.up)
            hidden_BSE = hidden_BSE + _linear(gated_BSE, layer.down)
        last_BSE = _rms_norm(hidden_BSE[:, S - keep :], self.norm)
        return _linear(last_BSE, self.lm_head).float()

    @torch.inference_mode()
    def _self_check(self) -> str | None:
        """None if a small left-padded prefill plus a decode step matches the model's forward."""
        from ludic.inference.kv_cache import new_cache

        config = self.model.config
        device = self.model.device
        generator = torch.Generator().manual_seed(0)
        ids_BS = torch.randint(0, int(config.vocab_size), (2, 6), generator=generator).to(device)
        mask_BT = torch.ones(2, 7, dtype=torch.long, device=device)
        mask_BT[1, :2] = 0  # row 1 is left-padded
        positions_BT = (mask_BT.cumsum(-1) - 1).clamp(min=0)
        try:
            lean_cache, hf_cache = new_cache(config), new_cache(config)
            lean = [self(ids_BS, mask_BT[:, :6], positions_BT[:, :6], lean_cache, keep=6)]
            hf = [
                self.model(
                    input_ids=ids_BS,
                    attention_mask=mask_BT[:, :6],
                    position_ids=positions_BT[:, :6],
                    past_key_values=hf_cache,
                    use_cache=True,
                ).logits.float()
            ]
            step_B1 = ids_BS[:, :1]
            lean.append(self(step_B1, mask_BT, positions_BT[:, 6:], lean_cache))
            hf_out = self.model(
                input_ids=step_B1,
                attention_mask=mask_BT,
                position_ids=positions_BT[:, 6:],
                past_key_values=hf_cache,
                use_cache=True,
            )
            hf.append(hf_out.logits.float())
        except Exception as e:  # an unexpected module layout: fall back
            return f"lean forward failed its self-check ({type(e).__name__}: {e})"
        real_B1S = mask_BT[:, None, :6].bool().transpose(1, 2)  # compare real positions only
        worst = max(
            float((lean[0] - hf[0]).abs().masked_fill(~real_B1S, 0).max()),
            float((lean[1] - hf[1]).abs().max()),
        )
        tolerance = _SELF_CHECK_ATOL if self.dtype == torch.float32 else 1e-1
        if not worst <= tolerance:
            return f"lean forward differs from the model's by {worst:.2e} in its self-check"
        return None


@dataclass(frozen=True, slots=True)
class _Layer:
    """One decoder layer's modules, looked up once (module attribute access is slow); weights
    are still read from the modules on every call, so updates apply."""

    input_norm: Any
    q: Any
    k: Any
    v: Any
    q_norm: Any
    k_norm: Any
    o: Any
    post_norm: Any
    gate: Any
    up: Any
    down: Any

    @classmethod
    def of(cls, layer: Any) -> _Layer:
        attention, mlp = layer.self_attn, layer.mlp
        return cls(
            input_norm=layer.input_layernorm,
            q=attention.q_proj,
            k=attention.k_proj,
            v=attention.v_proj,
            q_norm=getattr(attention, "q_norm", None),
            k_norm=getattr(attention, "k_norm", None),
            o=attention.o_proj,
            post_norm=layer.post_attention_layernorm,
            gate=mlp.gate_proj,
            up=mlp.up_proj,
            down=mlp.down_proj,
        )


def _unsupported(model: PreTrainedModel) -> str | None:
    config = model.config
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type {config.model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager", None):
        return f"attention implementation {config._attn_implementation!r}"
    decoder = getattr(model, "model", None)
    if decoder is None or not hasattr(decoder, "layers") or not hasattr(model, "lm_head"):
        return "unexpected module layout (no model.layers / lm_head)"
    for layer in decoder.layers:
        if getattr(layer, "attention_type", "full_attention") != "full_attention":
            return "a layer uses sliding-window attention"
        if not hasattr(layer.mlp, "gate_proj"):
            return "an MLP without gate/up/down projections"
    return None


def _attention_mask(key_mask_BT: torch.Tensor, S: int) -> torch.Tensor:
    """[B, 1, S, T]: new position s sees real keys up to itself, and always itself (so a padding
    query has a finite output instead of attending nothing)."""
    T = key_mask_BT.shape[1]
    if S == 1:
        return key_mask_BT[:, None, None, :]
    cols_T = torch.arange(T, device=key_mask_BT.device)
    rows_S1 = torch.arange(T - S, T, device=key_mask_BT.device)[:, None]
    causal_ST = cols_T[None, :] <= rows_S1
    itself_ST = cols_T[None, :] == rows_S1
    return ((key_mask_BT[:, None, :] & causal_ST) | itself_ST)[:, None]


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask as 0 / -inf, built once per forward instead of by SDPA in every
    layer."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, float("-inf")
    )


def _linear(x: torch.Tensor, module: Any) -> torch.Tensor:
    return F.linear(x, module.weight, module.bias)


def _rms_norm(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """transformers' Llama RMSNorm: normalise in float32, scale in the input dtype."""
    if x.dtype == torch.float32 and norm.weight.dtype == torch.float32:  # one fused kernel
        return F.rms_norm(x, x.shape[-1:], norm.weight, norm.variance_epsilon)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * x32.to(x.dtype)


def _rotate(x_BHSD: torch.Tensor, cos_B1SD: torch.Tensor, sin_B1SD: torch.Tensor) -> torch.Tensor:
    half = x_BHSD.shape[-1] // 2
    rotated = torch.cat((-x_BHSD[..., half:], x_BHSD[..., :half]), dim=-1)
    return x_BHSD * cos_B1SD + rotated * sin_B1SD

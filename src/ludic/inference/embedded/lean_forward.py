"""A lean forward pass for Llama-family decoders (Llama, Mistral, Qwen2, Qwen3), for the engine.

Calling a transformers model runs its module machinery (hooks, output capturing, per-step mask
building) around every layer: at decode time on a small model that costs more than the math
(the tiny model: ~5 ms per step at batch 1, of which ~0.5 ms is arithmetic). `LeanForward`
reads the model's own parameters (live: weight updates need no re-binding) and runs the same
arithmetic as a plain function: embed, per layer RMSNorm -> q/k/v (+ Qwen3's q/k norms) ->
rotary (the model's own rotary module, so every rope type works; for rope types whose frequencies
do not depend on the sequence length its cos/sin are computed once per position and looked up) ->
the KV cache -> SDPA with
GQA -> o_proj, RMSNorm -> gated MLP, then the final norm and lm_head on the kept positions.

Each layer's q/k/v weights, and its gate/up weights, are laid back to back in one buffer when the
LeanForward is built (the parameters become views of it: same Parameter objects, same values),
so each group runs as one GEMM and q and k are rotated together. The grouping is re-checked on
every call from the weights' addresses: a parameter given new storage afterwards (`p.data = x`)
only costs the fusion, never correctness; the weight receiver, which lays received buckets out
back to back, gets each group in one bucket, in order (`ludic.distributed.manifest.fused_groups`),
so the fusion survives it, and `weights_changed()` (before and after every update) drops the
joined views, which would otherwise keep the old storage alive while parameters move. The fused GEMM
computes every output column exactly as the separate ones do.

With 2 to 128 rows, the projections whose output only feeds elementwise ops and the next GEMM
(o_proj, gate/up, down) are computed as `(W @ x.T).T`: MKL's kernels for a short activation
matrix are up to 2x slower than for a short right-hand side (measured on the CPUs here). The
result is the same product (it can differ from `x @ W.T` in the last bit for 2-8 rows) and stays
a transposed view, which elementwise ops and the next `W @ x.T` consume without a copy.

`LeanForward(model, batch_invariant=True)` computes each position exactly as it would be computed
alone (`ludic.inference.embedded.batch_invariant`): GEMMs on at least 16 rows in one form,
attention sums in fixed blocks of each row's own keys, so a prefill, a decode step and the
trainer's `ludic.training.invariant_forward` agree bit for bit; start-up checks confirm it on
this machine.

`LeanForward(model, prepacked=True)` (`EngineConfig(prepacked_gemm=True)`) runs every GEMM through
oneDNN on a packed copy of its weight (`ludic.inference.embedded.prepacked_gemm`: faster decode on
CPU, a second copy of the weights, float-noise rounding; off by default); `weights_changed()`,
which the engine calls around every weight update, drops the packs.

`LeanForward.for_model(model)` returns None for anything else, and also when a self-check (one
small padded forward compared with the model's own) disagrees, so an unexpected variant falls
back to the transformers forward instead of serving wrong logprobs.

Legend: B rows, S new positions, N = B * S, T cached + new positions, H heads, K kv heads,
C = H + 2K projected heads, D head dim, E hidden size, I MLP width, V vocabulary.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch.nn.utils import parametrize
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from ludic.inference.embedded import batch_invariant as invariant
from ludic.inference.embedded.batch_invariant import linear as invariant_linear
from ludic.inference.embedded.prepacked_gemm import Packs, pack_for, packed_linear, unpackable
from ludic.inference.embedded.rotary import (  # re-exported: invariant_forward shares them
    _RotaryTable as _RotaryTable,
)
from ludic.inference.embedded.rotary import (
    _rotate as _rotate,
)
from ludic.inference.embedded.rotary import (
    _signed_rotary as _signed_rotary,
)
from ludic.inference.weights import pack_parameters_

logger = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_SELF_CHECK_ATOL = 1e-3
_TRANSPOSED_MAX_ROWS = 128
# Rope types whose frequencies are fixed (dynamic and longrope recompute them from the sequence
# length on every call, so those call the model's rotary module every forward).
_STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class LeanForward:
    """`__call__(ids_BS, key_mask_BT, positions_BS, cache, keep)` -> float logits of the last
    `keep` positions, [B, keep, V]; the cache grows by S positions like the model's own."""

    def __init__(
        self, model: PreTrainedModel, batch_invariant: bool = False, prepacked: bool = False
    ) -> None:
        self.model = model
        self.batch_invariant = batch_invariant
        layers = model.config.num_hidden_layers
        # at most 7 GEMM weights per layer (q, k, v, o, gate, up, down unfused) and lm_head
        self.packs = Packs(limit=7 * layers + 1) if prepacked else None
        self.dtype = model.dtype
        self.decoder: Any = model.model
        self.embed: Any = self.decoder.embed_tokens
        self.norm: Any = self.decoder.norm
        self.lm_head: Any = model.lm_head
        decoder_layers = self.decoder.layers[: model.config.num_hidden_layers]
        self.layers = [_Layer.of(layer) for layer in decoder_layers]
        for layer in self.layers:
            layer.qkv.pack(model)
            layer.gate_up.pack(model)
            if batch_invariant:
                layer.qkv.invariant = layer.gate_up.invariant = True
            layer.qkv.packs = layer.gate_up.packs = self.packs
        attention = decoder_layers[0].self_attn
        self.head_dim = int(attention.head_dim)
        self.heads = int(attention.q_proj.weight.shape[0]) // self.head_dim
        self.kv_heads = int(attention.k_proj.weight.shape[0]) // self.head_dim
        self.scaling = float(attention.scaling)
        self.qk_norm = hasattr(attention, "q_norm")
        rotary = self.decoder.rotary_emb
        static = getattr(rotary, "rope_type", None) in _STATIC_ROPE_TYPES
        self.rotary = _RotaryTable(rotary) if static else _signed_rotary(rotary)
        act = decoder_layers[0].mlp.act_fn
        self.act = F.silu if model.config.hidden_act == "silu" else act

    @classmethod
    def for_model(cls, model: PreTrainedModel) -> LeanForward | None:
        """A LeanForward for `model`, or None (with the reason logged) when it does not apply."""
        lean = cls.build(model)
        if isinstance(lean, str):
            logger.info("embedded engine uses the transformers forward: %s", lean)
            return None
        return lean

    @classmethod
    def build(
        cls, model: PreTrainedModel, batch_invariant: bool = False, prepacked: bool = False
    ) -> LeanForward | str:
        """A LeanForward for `model`, or why it does not apply (with `batch_invariant`, also
        when this machine's GEMMs are not row-invariant; with `prepacked`, when oneDNN cannot
        pack this model's weights)."""
        reason = _unsupported(model) or (unpackable(model, batch_invariant) if prepacked else None)
        if reason is not None:
            return reason
        try:
            lean = cls(model, batch_invariant, prepacked)
        except AttributeError as e:
            return f"unexpected module layout ({e})"
        reason = lean._self_check()
        if reason is None and batch_invariant:
            like = lean.embed.weight
            reason = invariant.gemm_problem(lean._weights()) or invariant.attention_problem(
                lean.heads, lean.kv_heads, lean.head_dim, like
            )
        return lean if reason is None else reason

    def weights_changed(self) -> None:
        """Drop the packed weight copies and the fused groups' joined views (rebuilt at the next
        forward); call after any weight update that may not bump the parameters' version
        counters, and before one that may give parameters new storage (the views would keep
        the old storage alive through it)."""
        if self.packs is not None:
            self.packs.clear()
        for layer in self.layers:
            layer.qkv.reset()
            layer.gate_up.reset()

    def _weights(self) -> list[torch.Tensor]:
        """A weight of every GEMM shape the forward can run (fused or not; layers share
        shapes)."""
        layer = self.layers[0]
        modules = [*layer.qkv.modules, *layer.gate_up.modules, layer.o, layer.down, self.lm_head]
        weights = [layer.qkv._weight, layer.gate_up._weight]
        weights += [m._parameters["weight"].detach() for m in modules]
        shapes = {tuple(w.shape): w for w in weights if w is not None}
        return list(shapes.values())

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
        N, H, K, D = B * S, self.heads, self.kv_heads, self.head_dim
        T = key_mask_BT.shape[1]
        hidden_NE = F.embedding(ids_BS.reshape(N), self.embed.weight)
        inv = self.batch_invariant
        if inv:
            layout = invariant.KeyLayout.of(key_mask_BT, S, self.kv_heads)
        else:
            attn_mask = _additive(_attention_mask(key_mask_BT.bool(), S), hidden_NE.dtype)
        cos_BSD, signed_sin_BSD = self.rotary(hidden_NE, positions_BS)
        cos_N1D, sin_N1D = cos_BSD.reshape(N, 1, D), signed_sin_BSD.reshape(N, 1, D)
        for i, layer in enumerate(self.layers):
            x_NE = _rms_norm(hidden_NE, layer.input_norm)
            qkv_NCD = layer.qkv(x_NE).view(N, -1, D)  # C = H + 2K heads: q, then k, then v
            if self.qk_norm:
                q_NHD = _rotate(_rms_norm(qkv_NCD[:, :H], layer.q_norm), cos_N1D, sin_N1D)
                k_NKD = _rotate(_rms_norm(qkv_NCD[:, H : H + K], layer.k_norm), cos_N1D, sin_N1D)
            else:  # q and k rotated together
                qk_NCD = _rotate(qkv_NCD[:, : H + K], cos_N1D, sin_N1D)
                q_NHD, k_NKD = qk_NCD[:, :H], qk_NCD[:, H:]
            q_BHSD = q_NHD.view(B, S, H, D).transpose(1, 2)
            k_BKSD = k_NKD.view(B, S, K, D).transpose(1, 2)
            v_BKSD = qkv_NCD[:, H + K :].view(B, S, K, D).transpose(1, 2)
            k_BKTD, v_BKTD = cast(DynamicLayer, cache.layers[i]).update(k_BKSD, v_BKSD)
            assert k_BKTD.shape[-2] == T, "the key mask must cover the cache and the new positions"
            if inv:
                out_BHSD = invariant.attention(q_BHSD, k_BKTD, v_BKTD, layout, self.scaling)
            else:
                out_BHSD = F.scaled_dot_product_attention(
                    q_BHSD,
                    k_BKTD,
                    v_BKTD,
                    attn_mask=attn_mask,
                    scale=self.scaling,
                    enable_gqa=H != K,
                )
            out_NE = out_BHSD.transpose(1, 2).reshape(N, -1)
            hidden_NE = hidden_NE + _linear(out_NE, layer.o, True, inv, self.packs)
            gate_up_N2I = layer.gate_up(_rms_norm(hidden_NE, layer.post_norm))
            gate_NI, up_NI = gate_up_N2I.chunk(2, dim=-1)
            mlp_NI = self.act(gate_NI) * up_NI
            hidden_NE = hidden_NE + _linear(mlp_NI, layer.down, True, inv, self.packs)
        last_BSE = _rms_norm(hidden_NE.view(B, S, -1)[:, S - keep :], self.norm)
        return _linear(last_BSE, self.lm_head, False, inv, self.packs).float()

    @torch.inference_mode()
    def _self_check(self) -> str | None:
        """None if a small left-padded prefill plus a decode step matches the model's forward."""
        from ludic.inference.embedded.kv_cache import cache_kwarg, new_cache

        config = self.model.config
        device = self.model.device
        generator = torch.Generator().manual_seed(0)
        ids_BS = torch.randint(0, int(config.vocab_size), (2, 6), generator=generator).to(device)
        mask_BT = torch.ones(2, 7, dtype=torch.long, device=device)
        mask_BT[1, :2] = 0  # row 1 is left-padded
        positions_BT = (mask_BT.cumsum(-1) - 1).clamp(min=0)
        kwarg = cache_kwarg(self.model)
        try:
            lean_cache, hf_cache = new_cache(config), new_cache(config)
            lean = [self(ids_BS, mask_BT[:, :6], positions_BT[:, :6], lean_cache, keep=6)]
            hf = [
                self.model(
                    input_ids=ids_BS,
                    attention_mask=mask_BT[:, :6],
                    position_ids=positions_BT[:, :6],
                    use_cache=True,
                    **{kwarg: hf_cache},
                ).logits.float()
            ]
            step_B1 = ids_BS[:, :1]
            lean.append(self(step_B1, mask_BT, positions_BT[:, 6:], lean_cache))
            hf_out = self.model(
                input_ids=step_B1,
                attention_mask=mask_BT,
                position_ids=positions_BT[:, 6:],
                use_cache=True,
                **{kwarg: hf_cache},
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


class _Fused:
    """Linear modules reading one input, run as one GEMM while their weights (and biases) lie
    back to back in memory; `__call__(x)` -> their outputs side by side. Each output column is
    computed exactly as by its own module. The layout is re-checked from the parameters'
    addresses on every call, so a parameter moved elsewhere falls back to one GEMM per module
    (and a copy to join them) instead of reading stale memory."""

    def __init__(self, modules: tuple[Any, ...], transposed_ok: bool = False) -> None:
        self.modules = modules
        self.transposed_ok = transposed_ok  # the output may be a transposed view (`_matmul`)
        self.invariant = False  # batch-invariant GEMMs (`batch_invariant.linear`)
        self.packs: Packs | None = None  # oneDNN-packed weights (`LeanForward(prepacked=True)`)
        self._params = [m._parameters for m in modules]  # direct: `m.weight` is a slow lookup
        self._layout: tuple[Any, ...] = ()
        self._weight: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None

    def pack(self, model: torch.nn.Module) -> None:
        """Lay the modules' weights, then their biases, back to back (values are kept)."""
        names = {id(p): name for name, p in model.named_parameters()}
        for attr in ("weight", "bias"):
            params = [getattr(m, attr) for m in self.modules]
            if all(p is not None and id(p) in names for p in params):
                pack_parameters_(model, [[names[id(p)] for p in params]])

    def reset(self) -> None:
        """Forget the joined views (they hold the parameters' storage); rebuilt at the next
        call."""
        self._layout, self._weight, self._bias = (), None, None

    @property
    def fused(self) -> bool:
        """Whether the last call ran as one GEMM (the weights, and biases, lay back to back)."""
        return self._weight is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weights = [p["weight"] for p in self._params]
        biases = [p["bias"] for p in self._params]
        layout = tuple((t.data_ptr(), t.shape) for t in weights + biases if t is not None)
        if layout != self._layout:
            self._layout = layout
            self._weight = _joined(weights)
            has_bias = [b is not None for b in biases]
            self._bias = _joined(biases) if all(has_bias) else None
            if any(has_bias) and self._bias is None:
                self._weight = None
        packs = self.packs
        if self._weight is None:
            pairs = zip(weights, biases, strict=True)
            return torch.cat(
                [
                    _matmul(x, w, b, self.transposed_ok, self.invariant, pack_for(packs, w, [w]))
                    for w, b in pairs
                ],
                -1,
            )
        pack = pack_for(packs, self._weight, weights)
        return _matmul(x, self._weight, self._bias, self.transposed_ok, self.invariant, pack)


def _joined(tensors: list[Any]) -> torch.Tensor | None:
    """One tensor viewing `tensors` (same trailing shape) stacked along dim 0, if they lie back
    to back in one storage; else None."""
    first = tensors[0]
    if first is None:
        return None
    size = first.element_size()
    address = first.data_ptr()
    storage = first.untyped_storage().data_ptr()
    for t in tensors:
        if (
            t is None
            or not t.is_contiguous()
            or t.dtype != first.dtype
            or t.shape[1:] != first.shape[1:]
            or t.data_ptr() != address
            or t.untyped_storage().data_ptr() != storage
        ):
            return None
        address += t.numel() * size
    rows = sum(t.shape[0] for t in tensors)
    return first.detach().as_strided((rows, *first.shape[1:]), first.stride())


@dataclass(frozen=True, slots=True)
class _Layer:
    """One decoder layer's modules, looked up once (module attribute access is slow); weights
    are still read from the modules on every call, so updates apply."""

    input_norm: Any
    qkv: _Fused
    q_norm: Any
    k_norm: Any
    o: Any
    post_norm: Any
    gate_up: _Fused
    down: Any

    @classmethod
    def of(cls, layer: Any) -> _Layer:
        attention, mlp = layer.self_attn, layer.mlp
        return cls(
            input_norm=layer.input_layernorm,
            qkv=_Fused((attention.q_proj, attention.k_proj, attention.v_proj)),
            q_norm=getattr(attention, "q_norm", None),
            k_norm=getattr(attention, "k_norm", None),
            o=attention.o_proj,
            post_norm=layer.post_attention_layernorm,
            gate_up=_Fused((mlp.gate_proj, mlp.up_proj), transposed_ok=True),
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
    if any(parametrize.is_parametrized(module) for module in model.modules()):
        return "parametrized weights (the lean forward reads parameters directly)"
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


def _linear(
    x: torch.Tensor,
    module: Any,
    transposed_ok: bool = False,
    invariant: bool = False,
    packs: Packs | None = None,
) -> torch.Tensor:
    params = module._parameters  # `module.weight` goes through the slow Module.__getattr__
    weight = params["weight"]
    pack = pack_for(packs, weight, [weight])
    return _matmul(x, weight, params["bias"], transposed_ok, invariant, pack)


def _matmul(
    x_NE: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    transposed_ok: bool,
    invariant: bool = False,
    pack: torch.Tensor | None = None,
) -> torch.Tensor:
    """x @ weight.T (+ bias); as (weight @ x.T).T, a transposed view, for 2-128 rows of 2D `x`
    when the caller accepts one (see the module docstring); batch-invariant if `invariant`;
    through oneDNN on `pack` (`weight` packed by `Packs`) if given."""
    if pack is not None:
        return packed_linear(x_NE, pack, bias)
    if invariant:
        return invariant_linear(x_NE, weight, bias)
    if transposed_ok and x_NE.dim() == 2 and 2 <= x_NE.shape[0] <= _TRANSPOSED_MAX_ROWS:
        y_NO = torch.mm(weight, x_NE.t()).t()
        return y_NO if bias is None else y_NO + bias
    return F.linear(x_NE, weight, bias)


def _rms_norm(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """transformers' Llama RMSNorm: normalise in float32, scale in the input dtype."""
    weight = norm._parameters["weight"]
    if x.dtype == torch.float32 and weight.dtype == torch.float32:  # one fused kernel
        return F.rms_norm(x, x.shape[-1:], weight, norm.variance_epsilon)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return weight * x32.to(x.dtype)

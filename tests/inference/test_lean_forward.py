"""LeanForward: the same logits as the transformers forward for every supported family, through
padded prefills, cached prefixes and decode steps; anything else falls back."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from ludic.inference.embedded.kv_cache import cache_kwarg, new_cache
from ludic.inference.embedded.lean_forward import LeanForward, _matmul, _RotaryTable
from ludic.models import build_tiny_model

SIZES = {
    "vocab_size": 97,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def build(config_cls: type[PretrainedConfig], model_cls: type[PreTrainedModel], **extra: object):
    torch.manual_seed(0)
    model = model_cls(config_cls(**{**SIZES, **extra})).eval()  # type: ignore[call-arg]
    with torch.no_grad():  # make the norms' weights matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.rand_like(p) * 0.5)
    return model


FAMILIES = {
    "llama": lambda: build(LlamaConfig, LlamaForCausalLM),
    "qwen2 (qkv bias)": lambda: build(Qwen2Config, Qwen2ForCausalLM),
    "qwen3 (q/k norms)": lambda: build(Qwen3Config, Qwen3ForCausalLM, head_dim=8),
    "llama3 rope scaling": lambda: build(
        LlamaConfig,
        LlamaForCausalLM,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "dynamic rope (frequencies change with length)": lambda: build(
        LlamaConfig,
        LlamaForCausalLM,
        max_position_embeddings=6,
        rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    ),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_matches_the_transformers_forward_through_prefill_prefix_and_decode(family: str) -> None:
    model = FAMILIES[family]()
    lean = LeanForward.for_model(model)
    assert lean is not None
    ids_BS = torch.randint(0, 97, (3, 9))
    mask_BT = torch.ones(3, 9, dtype=torch.long)
    mask_BT[1, :4] = 0  # left padding
    mask_BT[2, :7] = 0
    positions_BT = (mask_BT.cumsum(-1) - 1).clamp(min=0)
    lean_cache, hf_cache = new_cache(model.config), new_cache(model.config)
    with torch.inference_mode():
        # prefill in two chunks (the second one sees the first as a cached prefix), then decode
        chunks = [(0, 5), (5, 9), (9, 10), (10, 11)]
        for start, end in chunks:
            if end > 9:
                ids_BS = torch.cat([ids_BS, torch.randint(0, 97, (3, 1))], dim=1)
                mask_BT = torch.cat([mask_BT, torch.ones(3, 1, dtype=torch.long)], dim=1)
                positions_BT = torch.cat([positions_BT, positions_BT[:, -1:] + 1], dim=1)
            new_ids, positions = ids_BS[:, start:end], positions_BT[:, start:end]
            got = lean(new_ids, mask_BT[:, :end], positions, lean_cache, keep=end - start)
            want = model(
                input_ids=new_ids,
                attention_mask=mask_BT[:, :end],
                position_ids=positions,
                use_cache=True,
                **{cache_kwarg(model): hf_cache},
            ).logits.float()
            real = mask_BT[:, start:end, None].bool()
            assert torch.allclose(got.masked_fill(~real, 0), want.masked_fill(~real, 0), atol=1e-5)
            assert torch.isfinite(got).all()  # padding queries attend themselves, never nothing
    for lean_layer, hf_layer in zip(lean_cache.layers, hf_cache.layers, strict=True):
        real_keys = mask_BT[:, None, :, None].bool()
        assert torch.allclose(
            lean_layer.keys.masked_fill(~real_keys, 0),
            hf_layer.keys.masked_fill(~real_keys, 0),
            atol=1e-5,
        )


@pytest.mark.parametrize("family", [*FAMILIES, "ludic tiny model"])
@pytest.mark.parametrize("length", [16, 40])
def test_a_whole_row_gives_the_transformers_logits_bit_for_bit(family: str, length: int) -> None:
    # Over the same positions (one unpadded row, >= 16 GEMM rows) the lean forward runs the
    # transformers op sequence exactly: RMSNorm, rotary, fused projections, attention masking.
    # So the default engine's distance from the trainer's logprobs is only the decode step's
    # shape (one-row GEMMs, one-query attention over the cache), not an op done differently
    # (bench/ratio_floor.py measures each part).
    model = build_tiny_model(seed=0)[0] if family == "ludic tiny model" else FAMILIES[family]()
    lean = LeanForward.for_model(model)
    assert lean is not None
    vocab = int(model.config.vocab_size)
    ids_1L = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(1))
    ones_1L = torch.ones(1, length, dtype=torch.long)
    with torch.inference_mode():
        got = lean(ids_1L, ones_1L, torch.arange(length)[None], new_cache(model.config), length)
        want = model(input_ids=ids_1L).logits.float()
    assert torch.equal(got, want), float((got - want).abs().max())


def test_rotary_table_gives_the_rotary_modules_own_values() -> None:
    model = build(LlamaConfig, LlamaForCausalLM, hidden_size=128, num_attention_heads=2)
    lean = LeanForward.for_model(model)
    assert lean is not None and isinstance(lean.rotary, _RotaryTable)
    like = torch.zeros(1, 128)
    positions_BS = torch.tensor([[0, 1, 2], [7, 8, 9], [1500, 2999, 3000]])  # grows the table
    cos_BSD, signed_sin_BSD = lean.rotary(like, positions_BS)
    want_cos, want_sin = model.model.rotary_emb(like, positions_BS)
    assert torch.equal(cos_BSD, want_cos)
    assert torch.equal(signed_sin_BSD[..., 32:], want_sin[..., 32:])
    assert torch.equal(signed_sin_BSD[..., :32], -want_sin[..., :32])  # rotate-half's sign


def test_length_dependent_rope_calls_the_rotary_module_every_forward() -> None:
    model = FAMILIES["dynamic rope (frequencies change with length)"]()
    lean = LeanForward.for_model(model)
    assert lean is not None and not isinstance(lean.rotary, _RotaryTable)


def test_reads_live_parameters_so_weight_updates_apply() -> None:
    model = FAMILIES["llama"]()
    lean = LeanForward.for_model(model)
    assert lean is not None
    ids, mask, positions = torch.tensor([[5, 6, 7]]), torch.ones(1, 3), torch.arange(3)[None]
    before = lean(ids, mask, positions, new_cache(model.config))
    with torch.no_grad():
        model.lm_head.weight.mul_(2)
    after = lean(ids, mask, positions, new_cache(model.config))
    assert torch.allclose(after, before * 2, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen2 (qkv bias)"])
def test_fused_projections_read_the_parameters_wherever_they_live(family: str) -> None:
    model = FAMILIES[family]()
    lean = LeanForward.for_model(model)
    assert lean is not None
    attention = model.model.layers[0].self_attn
    q, k = attention.q_proj.weight, attention.k_proj.weight
    assert k.data_ptr() == q.data_ptr() + q.numel() * q.element_size()  # laid back to back
    ids, mask, positions = torch.tensor([[5, 6, 7]]), torch.ones(1, 3), torch.arange(3)[None]

    def check() -> None:
        with torch.inference_mode():
            want = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
            got = lean(ids, mask, positions, new_cache(model.config), keep=3)
        assert torch.allclose(got, want, atol=1e-5)

    check()
    assert all(layer.qkv._weight is not None for layer in lean.layers)  # one GEMM for q/k/v
    assert all(layer.gate_up._weight is not None for layer in lean.layers)
    with torch.no_grad():
        k.mul_(3)  # an in-place write lands in the fused weight
        model.model.layers[1].mlp.up_proj.weight.mul_(2)
    check()
    with torch.no_grad():
        k.data = k.data.clone() * 0.5  # new storage: layer 0 falls back to separate GEMMs
    check()
    assert lean.layers[0].qkv._weight is None and lean.layers[1].qkv._weight is not None


@pytest.mark.parametrize("rows", [1, 2, 5, 128, 129])
def test_projections_with_few_rows_run_transposed_with_the_same_result(rows: int) -> None:
    weight, bias, x_NE = torch.randn(48, 32), torch.randn(48), torch.randn(rows, 32)
    got = _matmul(x_NE, weight, bias, transposed_ok=True)
    assert torch.allclose(got, F.linear(x_NE, weight, bias), atol=1e-5)
    assert got.is_contiguous() == (rows == 1 or rows > 128)  # a transposed view for 2-128 rows
    assert _matmul(x_NE, weight, None, transposed_ok=False).is_contiguous()


def test_other_architectures_fall_back() -> None:
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50)).eval()
    assert LeanForward.for_model(gpt2) is None


def test_parametrized_weights_fall_back() -> None:
    model = FAMILIES["llama"]()
    torch.nn.utils.parametrizations.weight_norm(model.model.layers[0].mlp.down_proj)
    assert LeanForward.for_model(model) is None


def test_a_variant_that_computes_differently_fails_the_self_check() -> None:
    model = FAMILIES["llama"]()
    model.model.layers[0].mlp.act_fn = torch.nn.GELU()  # config still says silu
    assert LeanForward.for_model(model) is None

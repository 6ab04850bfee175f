"""`TrainerConfig(compile=True)` across the modes a real run mixes: how many Dynamo graphs each
compiled kind (MLP, RMSNorm) holds after training steps of several lengths (one-row
micro-batches, the shared-prefix path and the per-row one), the publisher's probe under
`torch.inference_mode`, an evaluation under `torch.no_grad` and a bf16-autocast step; the
no-grad calls running eager; and a kind past Dynamo's recompile limit warning once, by name,
and running eager instead of in silence."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator

import pytest
import torch
import torch._dynamo
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters
from training_fakes import ListSource, item, shared_prompt_group, tiny_llama

from ludic.distributed import InProcessPublisher
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.models import TinyModelSpec, build_tiny_model
from ludic.training import Trainer, TrainerConfig, collate, make_grpo
from ludic.training.compiled import (
    CompileFallbackWarning,
    compile_for_training,
    compiled_regions,
)
from ludic.training.logprobs import sequence_logprobs

SPEC = TinyModelSpec(hidden_size=64, intermediate_size=128, num_hidden_layers=2)


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    """Graph counts start from zero (other tests' compiled graphs are dropped)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def graphs_per_kind(model: torch.nn.Module) -> dict[str, int]:
    """Dynamo's cache entries (compiled graphs) of each compiled class's forward."""
    kinds = {type(module) for _, module in compiled_regions(model)}
    return {
        kind.__name__: len(_debug_get_cache_entry_list(kind.forward.__code__)) for kind in kinds
    }


def train_step(model: torch.nn.Module, rows: list, **options: object) -> torch.Tensor:
    batch = collate(rows, pad_token_id=0)
    model.zero_grad(set_to_none=True)
    logprobs_BT, _ = sequence_logprobs(model, batch, **options)  # type: ignore[arg-type]
    (logprobs_BT * batch.advantages_B[:, None]).sum().backward()
    return logprobs_BT.detach()


@pytest.mark.slow
def test_a_run_mixing_modes_compiles_one_graph_per_kind_and_autocast_setting() -> None:
    model, tokenizer = build_tiny_model(spec=SPEC)
    eager, _ = build_tiny_model(spec=SPEC)
    batches = [  # groups take the shared-prefix path, lone rows the per-row one
        [*shared_prompt_group(6, [14, 17, 12, 15], 0), item(9, seed=5)],
        [*shared_prompt_group(5, [9, 23, 11], 10), item(31, seed=6), item(3, seed=7)],
        [item(12, seed=8)],  # a one-row batch
    ]
    config = TrainerConfig(
        lr=1e-3, compile=True, shared_prefix=True, micro_batch_tokens=64, publish_every=1
    )
    with EmbeddedEngine(copy.deepcopy(model), tokenizer) as engine, warnings.catch_warnings():
        warnings.simplefilter("error", CompileFallbackWarning)
        publisher = InProcessPublisher(engine, probe_every=1)  # probes under inference_mode
        trainer = Trainer(model, make_grpo(), ListSource(batches), config, publisher=publisher)
        trainer.run(len(batches), progress=False)
        assert graphs_per_kind(model) == {"LlamaMLP": 1, "LlamaRMSNorm": 1}

        model.eval()  # an evaluation: no grad, eval mode
        with torch.no_grad():
            sequence_logprobs(model, collate(batches[1], pad_token_id=0))
        model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16):  # as TrainerConfig(dtype="bfloat16")
            train_step(model, batches[0], shared_prefix_min_tokens=4)
            train_step(model, batches[2])
        rows = shared_prompt_group(4, [7, 19], 30)
        eager.load_state_dict(model.state_dict())
        for options in ({}, {"shared_prefix_min_tokens": 4}, {"packed": True}):
            want = train_step(eager, rows, **options)
            torch.testing.assert_close(
                train_step(model, rows, **options), want, atol=2e-5, rtol=1e-5
            )
        for one_row in (rows[:1], [item(2, seed=9)]):
            torch.testing.assert_close(train_step(model, one_row), train_step(eager, one_row))
    assert graphs_per_kind(model) == {"LlamaMLP": 2, "LlamaRMSNorm": 2}  # float32 and bf16


def test_calls_without_grad_run_eager_and_compile_nothing() -> None:
    eager = tiny_llama(seed=3).eval()
    model = copy.deepcopy(eager)
    compile_for_training(model)
    ids = torch.tensor([[5, 9, 17, 3, 44, 8]])
    before = counters["stats"]["unique_graphs"]
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            assert torch.equal(model(input_ids=ids).logits, eager(input_ids=ids).logits)
    assert counters["stats"]["unique_graphs"] == before
    assert graphs_per_kind(model) == {"LlamaMLP": 0, "LlamaRMSNorm": 0}


def test_compiling_twice_adds_no_graphs_and_a_deep_copy_is_eager() -> None:
    model = tiny_llama(seed=4)
    compile_for_training(model)
    wrappers = [m._compiled_call_impl for _, m in compiled_regions(model)]
    compile_for_training(model)  # e.g. a second Trainer on the same model
    assert [m._compiled_call_impl for _, m in compiled_regions(model)] == wrappers
    twin = copy.deepcopy(model)  # e.g. an engine's copy: eager, as nn.Module.compile's
    assert all(m._compiled_call_impl is None for _, m in compiled_regions(twin))
    rows = shared_prompt_group(3, [7, 11], 40)
    torch.testing.assert_close(train_step(twin, rows), train_step(model, rows))
    assert graphs_per_kind(model) == {"LlamaMLP": 1, "LlamaRMSNorm": 1}


@pytest.mark.slow
def test_a_kind_past_the_recompile_limit_warns_once_by_name_and_runs_eager() -> None:
    eager = tiny_llama(seed=5)
    model = copy.deepcopy(eager)
    compile_for_training(model)
    rows = shared_prompt_group(4, [9, 13, 6], 50)
    with torch._dynamo.config.patch(recompile_limit=1), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        torch.testing.assert_close(train_step(model, rows), train_step(eager, rows))
        assert not [x for x in w if x.category is CompileFallbackWarning]
        for _ in range(2):  # bf16 autocast needs a second graph per kind: past a limit of 1
            with torch.autocast("cpu", dtype=torch.bfloat16):
                got = train_step(model, rows)
                got_grads = [p.grad for p in model.parameters()]
                assert torch.equal(got, train_step(eager, rows))  # eager: bit for bit
                for p, want in zip(eager.parameters(), got_grads, strict=True):
                    assert torch.equal(p.grad, want)
        torch.testing.assert_close(train_step(model, rows), train_step(eager, rows))
    fallbacks = [str(x.message) for x in w if x.category is CompileFallbackWarning]
    assert len(fallbacks) == 2, fallbacks  # once per kind, not per call or per module
    norm, mlp = sorted(fallbacks, key=lambda m: "RMSNorm" not in m)
    assert norm.startswith("TrainerConfig.compile: model.layers.0.input_layernorm (LlamaRMSNorm)")
    assert mlp.startswith("TrainerConfig.compile: model.layers.0.mlp (LlamaMLP)")
    for message in fallbacks:
        assert "recompile_limit = 1" in message and "autocast bfloat16" in message
        assert "raise torch._dynamo.config.recompile_limit" in message
    assert graphs_per_kind(model) == {"LlamaMLP": 1, "LlamaRMSNorm": 1}  # float32 still compiled


@pytest.mark.slow
def test_qwen3s_norms_on_views_keep_one_graph_per_input_rank() -> None:
    """Qwen3 normalises q and k per head: its RMSNorm also gets 4-D views of `q_proj(x)`,
    whose sizes Dynamo guarded through the view's base, so 1-row and 1-token calls recompiled
    (5 norm graphs in float32, and float32 then bf16 hit the recompile limit; found in
    review). Now: one graph per input rank and autocast setting."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
    )
    model = Qwen3ForCausalLM(config)
    compile_for_training(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileFallbackWarning)
        for bf16, counts in ((False, (1, 2)), (True, (2, 4))):
            for rows, tokens in [(3, 7), (1, 5), (2, 1), (1, 1), (4, 2)]:
                ids_BT = torch.randint(0, 100, (rows, tokens))
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    logits = model(input_ids=ids_BT, use_cache=False).logits
                logits.float().sum().backward()
            graphs = graphs_per_kind(model)
            assert (graphs["Qwen3MLP"], graphs["Qwen3RMSNorm"]) == counts

"""EngineConfig(prepacked_gemm=True): the lean forward's GEMMs on oneDNN-packed weight copies.

The packs are copies, so every test here is about them never serving stale weights: after
`update_weights`, after `update_weights_in_place` writing through `.data` (no version counter
bump), after in-place parameter updates the engine is not told about, and after a parameter is
given new storage. Each compares what the engine serves with the transformers forward of the
weights it should be serving (float noise, ~1e-5, against changes of > 0.05)."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from test_lean_forward import FAMILIES

from ludic.distributed import InProcessPublisher
from ludic.inference.client import ChatRequest
from ludic.inference.embedded.engine import EmbeddedEngine, EngineConfig
from ludic.inference.embedded.kv_cache import new_cache
from ludic.inference.embedded.lean_forward import LeanForward
from ludic.inference.sampling import SamplingConfig
from ludic.models import TinyModelSpec, build_tiny_model

SPEC = TinyModelSpec(hidden_size=64, intermediate_size=128, num_hidden_layers=2)
PROMPT = [5, 9, 13, 7, 21, 4]
NOISE = 1e-3  # float rounding of another GEMM kernel, with room
CHANGE = 0.05  # what the weight changes below move logprobs by, at least


@pytest.fixture(scope="module")
def tiny() -> tuple[torch.nn.Module, object]:
    return build_tiny_model(seed=0, spec=SPEC)


def forced_logprobs(
    model: torch.nn.Module, prompt: list[int], completion: list[int]
) -> list[float]:
    """The model's own (transformers forward) logprobs of `completion` after `prompt`."""
    ids_1T = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits_TV = model(input_ids=ids_1T).logits[0, len(prompt) - 1 : -1].float()
    logprobs_TV = torch.log_softmax(logits_TV, -1)
    return logprobs_TV.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1).tolist()


def greedy(engine: EmbeddedEngine, tokens: int = 12) -> tuple[list[int], list[float]]:
    sampling = SamplingConfig(temperature=0.0, max_tokens=tokens, extras={"ignore_eos": True})
    request = ChatRequest(messages=[], prompt_token_ids=PROMPT, sampling=sampling)
    response = asyncio.run(engine.complete(request))
    return list(response.completion_token_ids), list(response.completion_logprobs)


def worst(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def perturbed(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        name: t + 0.3 * t.std() * torch.randn(t.shape, generator=generator)
        if t.dim() == 2
        else t.clone()
        for name, t in model.state_dict().items()
    }


def serves(engine: EmbeddedEngine, reference: torch.nn.Module) -> float:
    """How far the engine's greedy logprobs are from `reference`'s on the same tokens."""
    tokens, logprobs = greedy(engine)
    return worst(logprobs, forced_logprobs(reference, PROMPT, tokens))


def test_packed_forward_matches_the_model_within_float_noise(tiny) -> None:
    model, _ = tiny
    lean = LeanForward.build(copy.deepcopy(model), prepacked=True)
    assert isinstance(lean, LeanForward)
    ids_BS = torch.tensor([PROMPT])
    positions_BS = torch.arange(len(PROMPT))[None]
    logits_BSV = lean(ids_BS, torch.ones_like(ids_BS), positions_BS, new_cache(model.config), 6)
    with torch.no_grad():
        expected_BSV = model(input_ids=ids_BS).logits.float()
    assert lean.packs is not None and len(lean.packs._entries) == 4 * 2 + 1  # really packed
    assert (logits_BSV - expected_BSV).abs().max() < NOISE


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_runs_packed_with_a_padded_prefill_and_decode(family: str) -> None:
    """q/k/v biases (Qwen2), q/k norms (Qwen3), rope variants: the packed forward passes the
    lean forward's own self-check (a left-padded prefill and a decode step against the model)."""
    model = FAMILIES[family]()
    lean = LeanForward.build(model, prepacked=True)
    assert isinstance(lean, LeanForward), lean
    assert lean.packs is not None and lean.packs._entries  # the self-check ran packed


def test_engine_serves_new_weights_after_update_weights(tiny) -> None:
    model, tokenizer = tiny
    new = copy.deepcopy(model)
    new.load_state_dict(perturbed(model, seed=1))
    config = EngineConfig(prepacked_gemm=True)
    with EmbeddedEngine(copy.deepcopy(model), tokenizer, config=config) as engine:
        assert serves(engine, model) < NOISE
        assert serves(engine, new) > CHANGE  # the change is visible at all
        engine.update_weights(new.state_dict())
        assert serves(engine, new) < NOISE


def test_engine_serves_new_weights_written_through_data_in_place(tiny) -> None:
    """`.data.copy_` bumps no version counter (as a broadcast into the parameters): the engine
    drops its packs after every `update_weights_in_place`."""
    model, tokenizer = tiny
    state = perturbed(model, seed=2)
    new = copy.deepcopy(model)
    new.load_state_dict(state)

    def fill(served: torch.nn.Module) -> None:
        for name, p in served.named_parameters():
            version = p._version
            p.data.copy_(state[name])
            assert p._version == version  # the case the version check cannot see

    config = EngineConfig(prepacked_gemm=True)
    with EmbeddedEngine(copy.deepcopy(model), tokenizer, config=config) as engine:
        greedy(engine)  # packs built from the old weights
        engine.update_weights_in_place(fill)
        assert serves(engine, new) < NOISE


def test_in_place_updates_the_engine_is_not_told_about_are_seen(tiny) -> None:
    """A model shared with an optimizer: in-place steps bump version counters, and a packed
    forward rebuilds the packs whose parameters changed (q, k and v are one fused pack)."""
    model, _ = tiny
    served = copy.deepcopy(model)
    lean = LeanForward.build(served, prepacked=True)
    assert isinstance(lean, LeanForward)
    ids_BS = torch.tensor([PROMPT])
    positions_BS = torch.arange(len(PROMPT))[None]

    def logits() -> torch.Tensor:
        cache = new_cache(model.config)
        return lean(ids_BS, torch.ones_like(ids_BS), positions_BS, cache, len(PROMPT))

    before = logits()
    with torch.no_grad():  # one parameter of a fused group, as an optimizer step would
        served.model.layers[0].self_attn.v_proj.weight.mul_(1.5)
        served.model.layers[1].mlp.down_proj.weight.add_(0.05)
    after = logits()
    with torch.no_grad():
        expected = served(input_ids=ids_BS).logits.float()
    assert (after - before).abs().max() > CHANGE
    assert (after - expected).abs().max() < NOISE


def test_parameters_given_new_storage_are_seen(tiny) -> None:
    model, _ = tiny
    served = copy.deepcopy(model)
    lean = LeanForward.build(served, prepacked=True)
    assert isinstance(lean, LeanForward)
    ids_BS = torch.tensor([PROMPT])
    positions_BS = torch.arange(len(PROMPT))[None]
    lean(ids_BS, torch.ones_like(ids_BS), positions_BS, new_cache(model.config))
    for name, p in served.named_parameters():  # a receiver laying them out its own way
        p.data = perturbed(model, seed=3)[name].clone()
    got = lean(ids_BS, torch.ones_like(ids_BS), positions_BS, new_cache(model.config))
    with torch.no_grad():
        expected = served(input_ids=ids_BS).logits[:, -1:].float()
    assert (got - expected).abs().max() < NOISE


def test_in_process_publisher_pushes_reach_a_packed_engine(tiny) -> None:
    model, tokenizer = tiny
    trainer_model = copy.deepcopy(model)
    config = EngineConfig(prepacked_gemm=True)
    with EmbeddedEngine(copy.deepcopy(model), tokenizer, config=config) as engine:
        publisher = InProcessPublisher(engine)
        greedy(engine)
        for version in (1, 2):
            trainer_model.load_state_dict(perturbed(model, seed=10 + version))
            publisher.publish(trainer_model, version=version)
            assert serves(engine, trainer_model) < NOISE


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (dict(prepacked_gemm=True, batch_invariant=True), "batch_invariant and prepacked_gemm"),
        (dict(prepacked_gemm=True, lean_forward=False), "lean_forward=False"),
    ],
)
def test_conflicting_settings_are_refused(tiny, config: dict[str, bool], words: str) -> None:
    model, tokenizer = tiny
    with pytest.raises(ValueError, match=words):
        EmbeddedEngine(copy.deepcopy(model), tokenizer, config=EngineConfig(**config)).close()


def test_a_float64_model_is_refused_naming_the_setting(tiny) -> None:
    model, tokenizer = tiny
    with pytest.raises(ValueError, match=r"prepacked_gemm.*float32 model on CPU"):
        config = EngineConfig(prepacked_gemm=True)
        EmbeddedEngine(copy.deepcopy(model).double(), tokenizer, config=config).close()

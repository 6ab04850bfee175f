"""EngineConfig(batch_invariant=True): a seeded request's tokens and logprobs are bit for bit the
same alone, in a batch of 32 and with random arrival delays, and a seeded online GRPO run gives
bit-identical weights whether the CPU is idle or loaded."""

from __future__ import annotations

import asyncio
import copy
import random
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
import torch
from engine_fakes import admitted_together

from ludic.agents import Agent
from ludic.distributed import InProcessPublisher
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference import ChatRequest, ChatResponse, SamplingConfig
from ludic.inference.embedded import batch_invariant as invariant
from ludic.inference.embedded.engine import EmbeddedEngine, EngineConfig
from ludic.inference.embedded.lean_forward import LeanForward
from ludic.interaction import SingleAgentProtocol
from ludic.models import TinyModelSpec, load_tiny_model
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
)
from ludic.training import RolloutBatchSource, Trainer, TrainerConfig, make_grpo
from ludic.types import Info, StepOutcome

INVARIANT = EngineConfig(batch_invariant=True)


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def requests_32() -> list[ChatRequest]:
    """32 requests: prompts of many lengths, every sampling knob, different budgets."""
    out = []
    for i in range(32):
        content = "Board: " + "X O " * (i % 7) + f"agent {i % 5}"
        sampling = SamplingConfig(
            max_tokens=6 + (i * 7) % 13,
            seed=i,
            temperature=(1.0, 0.7, 1.3, 0.0)[i % 4],
            top_p=1.0 if i % 3 else 0.9,
            top_k=-1 if i % 5 else 20,
        )
        out.append(ChatRequest(messages=[{"role": "user", "content": content}], sampling=sampling))
    return out


async def arriving_at_random(engine: EmbeddedEngine, requests: list[ChatRequest]) -> list[Any]:
    rng = random.Random()  # unseeded on purpose: a different schedule on every run

    async def later(request: ChatRequest) -> ChatResponse:
        await asyncio.sleep(rng.uniform(0, 0.3))
        return await engine.complete(request)

    return await asyncio.gather(*(later(r) for r in requests))


def outputs(responses: list[ChatResponse]) -> list[tuple[Any, ...]]:
    return [(r.completion_token_ids, r.completion_logprobs, r.finish_reason) for r in responses]


async def test_requests_alone_in_a_batch_of_32_and_with_random_delays_agree_bit_for_bit() -> None:
    model, tokenizer = load_tiny_model()
    with EmbeddedEngine(model, tokenizer, config=INVARIANT) as engine:
        assert engine._batch._lean is not None and engine._batch._lean.batch_invariant
        alone = [await engine.complete(r) for r in requests_32()]
        together = await admitted_together(engine, requests_32())
        delayed = await arriving_at_random(engine, requests_32())
    assert outputs(together) == outputs(alone)  # == on floats: bit for bit
    assert outputs(delayed) == outputs(alone)
    assert len({r.completion_token_ids for r in alone}) > 20  # the requests really differ


async def test_rows_at_any_slot_next_to_any_rows_get_their_alone_logits() -> None:
    """The lean forward itself: a prefill of left-padded prompts and decode steps, each row
    compared with the same row computed alone."""
    from ludic.inference.embedded.kv_cache import new_cache

    model, _ = load_tiny_model()
    lean = LeanForward.build(model, batch_invariant=True)
    assert isinstance(lean, LeanForward)
    generator = torch.Generator().manual_seed(0)
    lengths = [3, 9, 5, 9, 1, 7, 12, 2]
    ids_BS = torch.randint(3, 500, (len(lengths), 12), generator=generator)
    mask_BT = torch.zeros(len(lengths), 12, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask_BT[row, 12 - n :] = 1
    positions_BS = (mask_BT.cumsum(-1) - 1).clamp(min=0)
    batch_cache = new_cache(model.config)
    batched = lean(ids_BS, mask_BT, positions_BS, batch_cache, keep=1)
    step_B1 = ids_BS[:, :1]
    stepped = lean(
        step_B1,
        torch.cat([mask_BT, torch.ones_like(mask_BT[:, :1])], 1),
        positions_BS[:, -1:] + 1,
        batch_cache,
    )
    for row, n in enumerate(lengths):
        cache = new_cache(model.config)
        own = lean(
            ids_BS[row : row + 1, 12 - n :],
            mask_BT[row : row + 1, 12 - n :],
            positions_BS[row : row + 1, 12 - n :],
            cache,
            keep=1,
        )
        assert torch.equal(own, batched[row : row + 1])
        next_own = lean(
            step_B1[row : row + 1],
            torch.ones(1, n + 1, dtype=torch.long),
            torch.tensor([[n]]),
            cache,
        )
        assert torch.equal(next_own, stepped[row : row + 1])


def test_batch_invariance_needs_the_lean_forward() -> None:
    model, tokenizer = load_tiny_model()
    config = EngineConfig(batch_invariant=True, lean_forward=False)
    with pytest.raises(ValueError, match="batch_invariant=True runs the lean forward"):
        EmbeddedEngine(model, tokenizer, config=config)


def test_a_machine_whose_gemms_are_not_row_invariant_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no row padding, MKL computes one row (a matrix-vector product) differently from a
    row among 16: the start-up check sees it and the engine refuses to start."""
    monkeypatch.setattr(invariant, "MIN_ROWS", 1)
    model, tokenizer = load_tiny_model()
    with pytest.raises(ValueError, match="GEMM gives a row different bits in a batch of"):
        EmbeddedEngine(model, tokenizer, config=INVARIANT)


def test_attention_is_sdpa_up_to_rounding_and_position_invariant() -> None:
    """Values: SDPA's within float rounding, over left-padded rows of several lengths. Bits: the
    start-up probe (a position alone, in a mixed batch, in a prefill and in a longer causal
    forward) passes here."""
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 64, generator=generator)
    k, v = (torch.randn(2, 2, 300, 64, generator=generator) for _ in range(2))
    layout = invariant.KeyLayout.contiguous([300, 200], 5, 300, 2)
    out = invariant.attention(q, k, v, layout, 0.125)
    for row, keys in enumerate((300, 200)):
        mask = torch.ones(5, keys, dtype=torch.bool).tril(keys - 5)
        sdpa = torch.nn.functional.scaled_dot_product_attention(
            q[row : row + 1],
            k[row : row + 1, :, 300 - keys :],
            v[row : row + 1, :, 300 - keys :],
            attn_mask=mask,
            scale=0.125,
            enable_gqa=True,
        )
        torch.testing.assert_close(out[row : row + 1], sdpa, atol=1e-6, rtol=1e-5)
    assert invariant.attention_problem(4, 2, 64, torch.zeros(1)) is None


async def test_a_reused_prefix_gives_the_bits_of_a_fresh_prefill() -> None:
    """Turn 2 extends turn 1 (prompt + completion + a new message): with the KV of turn 1
    reused (a prefix hit) it gets exactly the tokens and logprobs a fresh engine gets."""
    model, tokenizer = load_tiny_model()
    first = ChatRequest(
        messages=[{"role": "user", "content": "Your move."}],
        sampling=SamplingConfig(max_tokens=12, seed=1, temperature=0.7, top_p=0.9),
    )

    def follow_up(reply: ChatResponse) -> ChatRequest:
        ids = [*reply.prompt_token_ids, *reply.completion_token_ids]
        ids += tokenizer.encode("<|im_end|>\n<|im_start|>user\nAgain.<|im_end|>\n")
        ids += tokenizer.encode("<|im_start|>assistant\n")
        sampling = SamplingConfig(max_tokens=12, seed=2, temperature=0.7, top_p=0.9)
        return ChatRequest(messages=[], prompt_token_ids=ids, sampling=sampling)

    with EmbeddedEngine(copy.deepcopy(model), tokenizer, config=INVARIANT) as engine:
        second = follow_up(await engine.complete(first))
        reused = await engine.complete(second)
        assert engine.status().prefix_hits == 1
    with EmbeddedEngine(copy.deepcopy(model), tokenizer, config=INVARIANT) as engine:
        fresh = await engine.complete(second)
        assert engine.status().prefix_hits == 0
    assert outputs([reused]) == outputs([fresh])


SPEC = TinyModelSpec(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tokenizer_vocab_size=300,
)


class SayOTwiceEnv(SingleAgentEnv):
    """Two turns; each rewards the fraction of the reply's characters that are "o"."""

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self.turn = 0
        return "Say something.", {}

    def env_step(self, action: str) -> StepOutcome:
        self.turn += 1
        reward = action.count("o") / max(1, len(action))
        return StepOutcome(obs="Again.", reward=reward, terminated=self.turn == 2)


class Jittered:
    """A ChatClient that sends each request after a random delay (a different schedule on
    every run), so requests share decode batches differently from run to run."""

    def __init__(self, engine: EmbeddedEngine) -> None:
        self.engine = engine
        self.rng = random.Random()

    async def complete(self, request: ChatRequest) -> ChatResponse:
        await asyncio.sleep(self.rng.uniform(0, 0.05))
        return await self.engine.complete(request)


def seeded_grpo_run(steps: int, config: EngineConfig) -> dict[str, torch.Tensor]:
    """A seeded online GRPO run (8 two-turn episodes in flight, weights pushed after every
    step) on the embedded engine; returns the trained weights."""
    model, tokenizer = load_tiny_model(seed=0, spec=SPEC)
    with EmbeddedEngine(copy.deepcopy(model), tokenizer, config=config) as engine:
        client = Jittered(engine)

        def protocol() -> SingleAgentProtocol:  # a fresh agent per episode: its call count
            agent = Agent(client, sampling=SamplingConfig(max_tokens=10))  # seeds its calls
            return SingleAgentProtocol(agent, max_steps=2)

        rollouts = RolloutEngine(
            env_registry={"say_o": SayOTwiceEnv},
            protocol_registry={"two": protocol},
            concurrency=8,
        )
        algorithm = make_grpo()
        source = RolloutBatchSource(
            engine=rollouts,
            requests_fn=lambda: [
                RolloutRequest(env=ComponentSpec(name="say_o"), protocol=ComponentSpec(name="two"))
                for _ in range(2)
            ],
            credit_assigner=algorithm.credit_assigner,
            strategy=GRPORequestStrategy(group_size=4),
            seed_sequencer=SeedSequencer(run_seed=0),
        )
        trainer_config = TrainerConfig(lr=1e-2, seed=0, pad_token_id=tokenizer.pad_token_id)
        publisher = InProcessPublisher(engine)
        history = Trainer(model, algorithm, source, trainer_config, publisher=publisher).run(
            steps, progress=False
        )
        assert engine.policy_version == steps
    assert all(h["num_samples"] > 0 for h in history)
    return {name: p.detach().clone() for name, p in model.state_dict().items()}


@pytest.mark.slow
def test_a_seeded_online_grpo_run_gives_the_same_weights_under_cpu_load(
    cpu_load: Callable[[], AbstractContextManager[object]],
) -> None:
    initial, _ = load_tiny_model(seed=0, spec=SPEC)
    idle = seeded_grpo_run(3, INVARIANT)
    with cpu_load():
        loaded = seeded_grpo_run(3, INVARIANT)
    assert any(not torch.equal(p, idle[n]) for n, p in initial.state_dict().items())  # trained
    different = [name for name, p in idle.items() if not torch.equal(p, loaded[name])]
    assert not different, f"weights differ between the idle and the loaded run: {different}"

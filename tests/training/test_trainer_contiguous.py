"""`TrainerConfig.contiguous_parameters`: the trainer's parameters laid out back to back (one
storage per dtype) before the optimizer is built. Training is the same to the bit (weights,
gradients, optimizer state), checkpoints save and resume with the layout kept, tied weights stay
tied, LoRA and sharded models are refused when asked for and skipped by default, and a real push
travels as a few spans with no packing copy."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from training_fakes import ListSource, WeightedNLL, mixed_items, tiny_llama
from transformers import LlamaConfig, LlamaForCausalLM

from layout_fakes import BASE_URL, served_in_process, storages, tiny_qwen2
from ludic.distributed.manifest import fused_groups
from ludic.distributed.transfer import adjacent_view
from ludic.training import CheckpointConfig, ConstantCredit, RLAlgorithm, Trainer, TrainerConfig
from ludic.training.contiguous_params import make_contiguous_, parameter_order

ALGORITHM = RLAlgorithm(name="test", credit_assigner=ConstantCredit(value=1.0), loss=WeightedNLL())
BATCHES = [mixed_items(4, seed=s) for s in range(4)]


class Recording:
    """A publisher that keeps nothing (the Trainer publishes through it)."""

    def __init__(self) -> None:
        self.versions: list[int] = []

    def publish(self, weights: object, *, version: int) -> None:
        self.versions.append(version)


def back_to_back(model: torch.nn.Module) -> bool:
    """Every parameter, in `parameter_order`, starts where the previous one ends."""
    params = [p for _, p in parameter_order(model)]
    return adjacent_view([p.detach() for p in params]) is not None


def test_layout_keeps_values_and_parameters_and_groups_fused_projections() -> None:
    model = tiny_qwen2()
    before = {n: t.clone() for n, t in model.state_dict().items()}
    params = {n: p for n, p in model.named_parameters()}
    assert len(storages(model)) == len(params)
    moved = make_contiguous_(model)
    assert moved == sum(p.numel() * 4 for p in params.values())
    assert len(storages(model)) == 1 and back_to_back(model)
    assert {n: p for n, p in model.named_parameters()} == params  # the same objects
    assert all(torch.equal(before[n], t) for n, t in model.state_dict().items())
    state = model.state_dict()
    for group in fused_groups(list(state)):  # q/k/v weights, q/k/v biases, gate/up
        assert adjacent_view([state[n] for n in group]) is not None, group
    assert make_contiguous_(model) == 0  # already laid out: nothing moves


def test_tied_weights_stay_tied_and_dtypes_get_a_storage_each() -> None:
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    model.model.norm.to(torch.bfloat16)
    make_contiguous_(model)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert len(storages(model)) == 2  # float32 and bfloat16
    with torch.no_grad():
        model.model.embed_tokens.weight[0, 0] = 7.0
    assert model.lm_head.weight[0, 0] == 7.0


def _trainer(
    model: torch.nn.Module, contiguous: bool | None, tmp_path: Path | None = None, **kw: object
) -> Trainer:
    config = TrainerConfig(
        lr=5e-3,
        weight_decay=0.1,
        micro_batch_tokens=32,
        contiguous_parameters=contiguous,
        checkpoint=None
        if tmp_path is None
        else CheckpointConfig(dir=str(tmp_path / "ckpt"), every_n_steps=2),
    )
    return Trainer(model, ALGORITHM, ListSource(BATCHES), config, **kw)  # type: ignore[arg-type]


def test_training_is_the_same_to_the_bit_with_the_layout() -> None:
    plain = _trainer(tiny_qwen2(), contiguous=False)
    laid = _trainer(tiny_qwen2(), contiguous=True)
    assert len(storages(plain.model)) > 1 and len(storages(laid.model)) == 1
    for _ in range(3):
        a, b = plain.run(1, progress=False)[0], laid.run(1, progress=False)[0]
        assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"]
    for (name, x), y in zip(
        plain.model.state_dict().items(), laid.model.state_dict().values(), strict=True
    ):
        assert torch.equal(x, y), name
    # Gradients of one more backward, and the AdamW moments, agree exactly too.
    ids = torch.tensor([[3, 14, 15, 92, 65, 35]])
    for trainer in (plain, laid):
        trainer.model(input_ids=ids, labels=ids).loss.backward()
    for p, q in zip(plain.model.parameters(), laid.model.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None and torch.equal(p.grad, q.grad)
    states = [t.optimizer.state_dict()["state"] for t in (plain, laid)]
    assert states[0].keys() == states[1].keys()
    for index, moments in states[0].items():
        for key, value in moments.items():
            assert torch.equal(value, states[1][index][key]), (index, key)
    assert len(storages(laid.model)) == 1  # steps write in place: the layout holds


def test_checkpoint_round_trip_resumes_the_same_run_and_keeps_the_layout(
    tmp_path: Path,
) -> None:
    full = _trainer(tiny_qwen2(), contiguous=True, tmp_path=tmp_path / "a")
    full_losses = [m["loss"] for m in full.run(4, progress=False)]
    first = _trainer(tiny_qwen2(), contiguous=True, tmp_path=tmp_path / "b")
    first.run(3, progress=False)  # checkpoint at step 2
    resumed = _trainer(tiny_qwen2(seed=5), contiguous=True, tmp_path=tmp_path / "b")
    assert resumed.resume() == 2
    assert len(storages(resumed.model)) == 1 and back_to_back(resumed.model)
    assert [m["loss"] for m in resumed.run(2, progress=False)] == full_losses[2:]
    for (name, a), b in zip(
        full.model.state_dict().items(), resumed.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name


def test_default_lays_out_only_with_a_publisher() -> None:
    alone = _trainer(tiny_llama(), contiguous=None)
    assert len(storages(alone.model)) > 1  # nothing to gain without a publisher
    publishing = _trainer(tiny_llama(), contiguous=None, publisher=Recording())
    assert len(storages(publishing.model)) == 1


def test_lora_is_refused_when_asked_and_skipped_by_default() -> None:
    peft = pytest.importorskip("peft")
    lora = peft.get_peft_model(
        tiny_llama(), peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"])
    )
    with pytest.raises(ValueError, match=r"contiguous_parameters=True.*LoRA.*set it to False"):
        _trainer(lora, contiguous=True)
    kept = storages(lora)
    trainer = _trainer(lora, contiguous=None, publisher=Recording())
    assert storages(trainer.model) == kept


def test_sharded_parameters_are_refused_when_asked_and_skipped_by_default() -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from ludic.training import LocalRuntime

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = tiny_llama()
        fully_shard(model)  # FSDP2 over one rank: DTensor parameters
        with pytest.raises(ValueError, match=r"contiguous_parameters=True.*sharded"):
            _trainer(model, contiguous=True, runtime=LocalRuntime())
        kept = [p.to_local().data_ptr() for p in model.parameters()]
        _trainer(model, contiguous=None, runtime=LocalRuntime(), publisher=Recording())
        assert [p.to_local().data_ptr() for p in model.parameters()] == kept
    finally:
        dist.destroy_process_group()


@pytest.fixture
def served() -> Iterator[tuple[torch.nn.Module, object]]:
    """A tiny model for the trainer and an embedded server (in process) serving a copy."""
    from ludic.models import TinyModelSpec, build_tiny_model

    spec = TinyModelSpec(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tokenizer_vocab_size=300,
    )
    model, tokenizer = build_tiny_model(seed=0, spec=spec)
    with served_in_process(copy.deepcopy(model), tokenizer, token="t0ken") as (_, client, _):
        yield model, client


@pytest.mark.distributed
@pytest.mark.timeout(120)
@pytest.mark.parametrize("contiguous", [None, False])
def test_a_trainers_push_travels_as_a_few_spans(
    served: tuple[torch.nn.Module, object], contiguous: bool | None
) -> None:
    from ludic.distributed import BroadcastPolicyPublisher

    model, client = served
    publisher = BroadcastPolicyPublisher(
        BASE_URL,
        "t0ken",
        http=client,  # type: ignore[arg-type]
        timeout_s=20,
        pack_below_mb=8192 / 2**20,  # tensors >= 8 KB travel alone unless back to back
        bucket_mb=0.25,
        probe=False,
    )
    trainer = _trainer(model, contiguous=contiguous, publisher=publisher)
    trainer.run(1, progress=False)  # publishes version 1
    stats = publisher.last_push
    assert stats is not None and stats.version == 1
    tensors = len(model.state_dict())
    if contiguous is None:  # the default with a publisher: laid out
        assert stats.num_buckets <= 3 and publisher._pool.nbytes == 0  # spans, no packing copy
    else:
        assert stats.num_buckets > tensors // 3 and publisher._pool.nbytes > 0
    publisher.close()

"""The optimisation loop: an update happens, the NaN guard, stale dropping, publishing, eval,
logging, empty batches and the LR schedule."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest
import torch
from training_fakes import ListSource, WeightedNLL, item, mixed_items, params_snapshot, tiny_llama

from ludic.training import (
    BatchSourceExhausted,
    ConstantCredit,
    JsonlLogger,
    RLAlgorithm,
    SAWBatch,
    Trainer,
    TrainerConfig,
    TrainingStalledError,
    read_metrics_jsonl,
)
from ludic.types import JSON, Rollout


def algorithm(poison: bool = False) -> RLAlgorithm:
    return RLAlgorithm(
        name="test", credit_assigner=ConstantCredit(value=1.0), loss=WeightedNLL(poison=poison)
    )


@dataclass
class RecordingPublisher:
    versions: list[int] = field(default_factory=list)

    def publish(self, weights: object, *, version: int) -> None:
        assert isinstance(weights, torch.nn.Module)
        self.versions.append(version)


async def test_step_updates_weights_and_version() -> None:
    model = tiny_llama()
    before = params_snapshot(model)
    trainer = Trainer(model, algorithm(), ListSource([mixed_items(4)]), TrainerConfig(lr=1e-2))
    metrics = await trainer.train_step()
    assert trainer.step == 1 and trainer.policy_version == 1
    assert metrics["num_samples"] == 4 and metrics["loss"] == pytest.approx(metrics["loss"])
    assert metrics["grad_norm"] > 0 and metrics["lr"] == pytest.approx(1e-2)
    assert metrics["batch/position"] == 1.0 and "reward_mean" not in metrics
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


async def test_nan_guard_skips_step_and_leaves_weights(caplog: pytest.LogCaptureFixture) -> None:
    model = tiny_llama()
    before = params_snapshot(model)
    publisher = RecordingPublisher()
    trainer = Trainer(
        model,
        algorithm(poison=True),
        ListSource([mixed_items(4)]),
        TrainerConfig(lr=1e-2),
        publisher=publisher,
    )
    with caplog.at_level(logging.WARNING):
        metrics = await trainer.train_step()
    assert metrics["skipped_nonfinite"] == 1.0 and "non-finite" in caplog.text
    assert trainer.step == 1 and trainer.policy_version == 0 and publisher.versions == []
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert trainer.optimizer.state_dict()["state"] == {}  # Adam moments untouched
    assert trainer.scheduler.last_epoch == 0


async def test_nan_guard_catches_nonfinite_gradient() -> None:
    # A finite loss whose gradient is inf: a hook corrupts one parameter's gradient.
    model = tiny_llama()
    model.lm_head.weight.register_hook(lambda g: g * float("inf"))
    before = params_snapshot(model)
    trainer = Trainer(model, algorithm(), ListSource([mixed_items(4)]), TrainerConfig(lr=1e-2))
    metrics = await trainer.train_step()
    assert metrics["skipped_nonfinite"] == 1.0 and metrics["loss"] == pytest.approx(metrics["loss"])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert trainer.policy_version == 0


async def test_stale_samples_dropped_by_max_lag() -> None:
    fresh = [item(8, seed=1, versions=[3]), item(8, seed=2, versions=[2, 3])]
    stale = [item(8, seed=3, versions=[1, 3]), item(8, seed=4, versions=[0])]
    unversioned = [item(8, seed=5)]
    trainer = Trainer(
        tiny_llama(),
        algorithm(),
        ListSource([fresh + stale + unversioned]),
        TrainerConfig(max_lag=1, initial_policy_version=3),
    )
    metrics = await trainer.train_step()
    # lag = 3 - min(versions): 0 and 1 kept, 2 and 3 dropped; no versions: kept.
    assert metrics["dropped_stale"] == 2.0 and metrics["num_samples"] == 3.0


async def test_all_stale_batch_is_skipped_without_update() -> None:
    model = tiny_llama()
    before = params_snapshot(model)
    trainer = Trainer(
        model,
        algorithm(),
        ListSource([[item(8, versions=[0])]]),
        TrainerConfig(max_lag=0, initial_policy_version=5),
    )
    metrics = await trainer.train_step()
    assert metrics["skipped_empty"] == 1.0 and metrics["dropped_stale"] == 1.0
    assert trainer.policy_version == 5 and trainer.step == 1
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


async def test_samples_without_trainable_tokens_are_dropped() -> None:
    # After capping at 4 tokens, a sample with a 6-token prompt has no action left.
    long_prompt = item(10, prompt=6, seed=1)
    trainer = Trainer(
        tiny_llama(),
        algorithm(),
        ListSource([[long_prompt, item(4, seed=2)]]),
        TrainerConfig(max_seq_len=4),
    )
    metrics = await trainer.train_step()
    assert metrics["dropped_no_action_tokens"] == 1.0 and metrics["num_samples"] == 1.0


async def test_publish_every_n_updates() -> None:
    publisher = RecordingPublisher()
    trainer = Trainer(
        tiny_llama(),
        algorithm(),
        ListSource([mixed_items(2)]),
        TrainerConfig(publish_every=2),
        publisher=publisher,
    )
    await trainer.train(5, progress=False)
    assert publisher.versions == [2, 4]


async def test_eval_hook_and_jsonl_logger(tmp_path) -> None:
    calls: list[int] = []

    async def evaluate(trainer: Trainer) -> dict[str, float]:
        calls.append(trainer.step)
        return {"accuracy": 0.5}

    log = JsonlLogger(tmp_path / "metrics.jsonl")
    trainer = Trainer(
        tiny_llama(),
        algorithm(),
        ListSource([mixed_items(2)]),
        TrainerConfig(eval_every=2),
        logger=log,
        eval_fn=evaluate,
    )
    history = await trainer.train(4, progress=False)
    trainer.close()
    assert calls == [2, 4]
    assert history[1]["eval/accuracy"] == 0.5 and "eval/accuracy" not in history[0]
    records = read_metrics_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert records[3]["loss"] == pytest.approx(history[3]["loss"])


async def test_train_stops_when_source_is_exhausted() -> None:
    class TwoBatches(ListSource):
        async def next_batch(self) -> SAWBatch:
            if self.position == 2:
                raise BatchSourceExhausted("done")
            return await super().next_batch()

    trainer = Trainer(tiny_llama(), algorithm(), TwoBatches([mixed_items(2)]), TrainerConfig())
    history = await trainer.train(10, progress=False)
    assert len(history) == 2 and trainer.step == 2


async def test_warmup_schedule_reaches_peak() -> None:
    trainer = Trainer(
        tiny_llama(),
        algorithm(),
        ListSource([mixed_items(2)]),
        TrainerConfig(lr=1.0, warmup_steps=4),
    )
    history = await trainer.train(5, progress=False)
    assert [h["lr"] for h in history] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])


def test_run_is_the_sync_entry_point() -> None:
    trainer = Trainer(tiny_llama(), algorithm(), ListSource([mixed_items(2)]), TrainerConfig())
    assert len(trainer.run(2, progress=False)) == 2


def test_sync_batch_source_is_accepted() -> None:
    class SyncSource:
        def next_batch(self) -> SAWBatch:
            return SAWBatch(items=mixed_items(2))

        def state_dict(self) -> JSON:
            return {}

    trainer = Trainer(tiny_llama(), algorithm(), SyncSource(), TrainerConfig())  # type: ignore[arg-type]
    assert trainer.run(1, progress=False)[0]["num_samples"] == 2


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="total_steps"):
        TrainerConfig(lr_schedule="cosine")
    with pytest.raises(ValueError, match="max_lag"):
        TrainerConfig(max_lag=-1)
    with pytest.raises(ValueError, match="lr"):
        TrainerConfig(lr=0.0)


async def test_reference_and_entropy_terms_reach_the_loss() -> None:
    from ludic.training import make_grpo

    algorithm_kl = make_grpo(kl_beta=0.1, entropy_coef=0.01)
    model = tiny_llama(seed=0)
    trainer = Trainer(
        model,
        algorithm_kl,
        ListSource([mixed_items(3)]),
        TrainerConfig(lr=1e-2),
        ref_model=tiny_llama(seed=0),
    )
    first = await trainer.train_step()
    second = await trainer.train_step()
    kl_keys = [k for k in first if k.endswith("kl_ref")]
    entropy_keys = [k for k in first if k.endswith("entropy")]
    assert kl_keys and entropy_keys
    # Same weights as the reference at step 1: KL 0; after an update it is positive (k3 >= 0).
    assert first[kl_keys[0]] == pytest.approx(0.0, abs=1e-6)
    assert second[kl_keys[0]] > 0
    assert first[entropy_keys[0]] > 0
    assert all(p.grad is None for p in trainer.ref_model.parameters())  # type: ignore[union-attr]


async def test_bfloat16_autocast_step() -> None:
    model = tiny_llama()
    trainer = Trainer(
        model, algorithm(), ListSource([mixed_items(3)]), TrainerConfig(dtype="bfloat16")
    )
    metrics = await trainer.train_step()
    assert metrics.get("skipped_nonfinite") is None and trainer.policy_version == 1
    assert all(p.dtype == torch.float32 for p in model.parameters())


# -- a run that cannot progress says so ---------------------------------------------------------


async def test_all_stale_steps_in_a_row_raise_naming_versions_and_fix(tmp_path) -> None:
    log = JsonlLogger(tmp_path / "metrics.jsonl")
    stale = [item(8, seed=s, versions=[0]) for s in range(3)]
    trainer = Trainer(
        tiny_llama(),
        algorithm(),
        ListSource([stale]),
        TrainerConfig(max_lag=1, initial_policy_version=5, max_skipped_steps=3),
        logger=log,
    )
    await trainer.train_step()
    await trainer.train_step()
    with pytest.raises(TrainingStalledError) as caught:
        await trainer.train(10, progress=False)
    message = str(caught.value)
    assert "3 steps in a row (steps 1..3) trained nothing (stale x3)" in message
    assert "all 3 samples were stale: policy_version 5, sample versions 0..0, max_lag 1" in message
    assert "is the inference server serving the trainer's weights?" in message
    assert "max_skipped_steps=3" in message
    assert trainer.step == 3 and trainer.policy_version == 5
    log.close()
    assert [r["skipped_empty"] for r in read_metrics_jsonl(tmp_path / "metrics.jsonl")] == [1.0] * 3


async def test_every_episode_failed_is_named_with_the_first_error() -> None:
    failed = [Rollout(meta={"error": "env exploded", "error_type": "RuntimeError"})] * 4

    class Failing(ListSource):
        async def next_batch(self) -> SAWBatch:
            return SAWBatch(items=[], rollouts=failed)

    trainer = Trainer(tiny_llama(), algorithm(), Failing([[]]), TrainerConfig(max_skipped_steps=2))
    with pytest.raises(
        TrainingStalledError,
        match=r"every episode failed \(4 of 4 rollouts; "
        r"first error: RuntimeError: env exploded\).*meta\['error'\]",
    ):
        await trainer.train(5, progress=False)
    assert trainer.step == 2


async def test_non_finite_and_empty_batches_are_named() -> None:
    poisoned = Trainer(
        tiny_llama(),
        algorithm(poison=True),
        ListSource([mixed_items(2)]),
        TrainerConfig(max_skipped_steps=2),
    )
    with pytest.raises(TrainingStalledError, match=r"nonfinite x2.*non-finite loss.*lower lr"):
        await poisoned.train(5, progress=False)
    empty = Trainer(tiny_llama(), algorithm(), ListSource([[]]), TrainerConfig(max_skipped_steps=1))
    with pytest.raises(TrainingStalledError, match="the batch source returned no samples"):
        await empty.train_step()


async def test_a_trained_step_resets_the_count_and_none_never_stops() -> None:
    stale, fresh = [item(8, versions=[0])], [item(8, seed=1)]
    trainer = Trainer(
        tiny_llama(),
        algorithm(),
        ListSource([stale, stale, fresh, stale, stale, fresh]),
        TrainerConfig(max_lag=0, initial_policy_version=1, max_skipped_steps=3),
    )
    history = await trainer.train(6, progress=False)  # never 3 skipped in a row
    assert [h.get("skipped_empty", 0.0) for h in history] == [1, 1, 0, 1, 1, 0]
    never = Trainer(
        tiny_llama(), algorithm(), ListSource([[]]), TrainerConfig(max_skipped_steps=None)
    )
    assert len(await never.train(8, progress=False)) == 8


def test_max_skipped_steps_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_skipped_steps"):
        TrainerConfig(max_skipped_steps=0)

"""Resuming on another number of ranks than the checkpoint was written by: every rank takes
rank 0's RNG and data position and rank 0 warns, a one-process checkpoint included (it holds no
per-rank states); a rank whose batch source refuses rank 0's position (a per-rank seed or file)
says why it was handed that position and tells the other ranks, which stop with it instead of
waiting in the next collective. The 2-rank runs of a resume are in test_fsdp.py."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from training_fakes import CountingRuntime, ListSource, mixed_items, tiny_llama

from ludic.training import CheckpointConfig, Trainer, TrainerConfig, make_grpo, read_checkpoint
from ludic.training.checkpoint_contents import rank_state_for
from ludic.training.trainer_checkpoints import restore_checkpoint
from ludic.types import JSON


def _one_process_checkpoint(root: Path) -> Path:
    config = TrainerConfig(lr=1e-3, checkpoint=CheckpointConfig(dir=str(root), every_n_steps=1))
    trainer = Trainer(tiny_llama(seed=0), make_grpo(), ListSource([mixed_items(2, seed=1)]), config)
    trainer.run(1, progress=False)
    return root / "step_00000001"


def test_a_one_process_checkpoint_resumed_on_two_ranks_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    loaded = read_checkpoint(_one_process_checkpoint(tmp_path / "ckpt"))
    assert loaded.rank_states is None  # one process: no per-rank states
    caplog.clear()  # the Trainer's own warnings (this test's checkpoints hold no tokenizer)
    with caplog.at_level(logging.WARNING, logger="ludic.training.checkpoint_contents"):
        assert rank_state_for(loaded, 0, 1).data_state == {"position": 1}
        assert caplog.messages == []  # the same world size: nothing to say
        assert rank_state_for(loaded, 0, 2).data_state == {"position": 1}
        assert rank_state_for(loaded, 1, 2).data_state == {"position": 1}
    assert caplog.messages == [
        "step_00000001 was written by 1 rank, resuming on 2: every rank takes rank 0's RNG and "
        "data position"
    ]  # rank 0 alone says it


class _RankOneOfTwo(CountingRuntime):
    """Rank 1 of 2 whose peer, rank 0, does its part without failing: what rank 0 broadcasts is
    scripted (the checkpoint it chose, then its check that the checkpoint fits)."""

    def __init__(self, broadcasts: list[Any]) -> None:
        super().__init__()
        self.broadcasts = broadcasts

    @property
    def rank(self) -> int:
        return 1

    @property
    def world_size(self) -> int:
        return 2

    @property
    def is_main(self) -> bool:
        return False

    def all_gather_object(self, obj: Any) -> list[Any]:
        self.calls.append("all_gather_object")
        return [obj, obj]  # rank 0 gives what this rank gives; a failed rank raises its own error

    def broadcast_object(self, obj: Any) -> Any:
        self.calls.append("broadcast_object")
        return self.broadcasts.pop(0)

    def load_model_state(self, model: Any, state: Any) -> None:
        self.calls.append("load_model_state")  # rank 0 holds the weights, as under FSDP

    def load_optimizer_state(self, model: Any, optimizer: Any, state: Any) -> None:
        self.calls.append("load_optimizer_state")


class _SeededByRank(ListSource):
    """A source shuffled by a seed of its own (e.g. seed=rank): another seed's position is
    refused, as `OfflineBatchSource` refuses it."""

    def __init__(self, seed: int) -> None:
        super().__init__([mixed_items(2, seed=1)])
        self.seed = seed

    def state_dict(self) -> JSON:
        return {"position": self.position, "seed": self.seed}

    def load_state_dict(self, state: JSON) -> None:
        if state.get("seed", 0) != self.seed:  # type: ignore[union-attr]
            raise ValueError(f"shuffled with seed {state.get('seed', 0)}, this source with 1")  # type: ignore[union-attr]
        super().load_state_dict(state)


def test_a_rank_refusing_rank_0s_position_says_why_and_stops_the_others(tmp_path: Path) -> None:
    checkpoint = _one_process_checkpoint(tmp_path / "ckpt")
    # rank 0's answers: the checkpoint chosen, then its weights and its optimizer state fit
    runtime = _RankOneOfTwo(broadcasts=[(True, checkpoint), (True, None), (True, None)])
    config = TrainerConfig(
        lr=1e-3, checkpoint=CheckpointConfig(dir=str(tmp_path / "resumed"), every_n_steps=1)
    )
    trainer = Trainer(
        tiny_llama(seed=1), make_grpo(), _SeededByRank(seed=1), config, runtime=runtime
    )
    runtime.calls.clear()
    with pytest.raises(ValueError) as caught:
        restore_checkpoint(trainer, checkpoint, missing_ok=False, override_lr_schedule=False)
    message = str(caught.value)
    assert message.startswith(
        "rank 1 of 2 resumes step_00000001, written by 1 rank, from rank 0's data position, "
        "and its batch source refuses it: shuffled with seed 0, this source with 1."
    )
    assert "resumes only on the number of ranks that saved it" in message
    # It told the other rank (one all-reduce, then the causes), so rank 0 raises too.
    assert runtime.calls[-2:] == ["any_rank", "all_gather_object"]
    assert trainer.step == 0


def test_the_fsdp_section_says_what_a_refused_position_does() -> None:
    readme = Path(__file__).resolve().parents[2] / "README.md"
    text = readme.read_text(encoding="utf-8")
    start = text.index("## Multi-process training (FSDP2)")
    section = " ".join(text[start : text.index("\n## ", start + 1)].split())
    assert "on another (a one-process checkpoint included), every rank takes rank 0's" in section
    assert "stops every rank, saying so: resume it on the number of ranks that saved it" in section

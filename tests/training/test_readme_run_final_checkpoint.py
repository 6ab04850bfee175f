"""`trainer.run(n)` saves only at multiples of `every_n_steps` (no final checkpoint, unlike
`ludic train`), and the README's "Checkpoints and resume" says so; its FSDP script runs under
plain `python` too, where torchrun's RANK is unset."""

from __future__ import annotations

import re
from pathlib import Path

from training_fakes import ListSource, mixed_items, tiny_llama

from ludic.training import CheckpointConfig, Trainer, TrainerConfig, make_grpo
from ludic.training.checkpoint_contents import LoadedCheckpoint, RankState, rank_state_for

README = Path(__file__).resolve().parents[2] / "README.md"


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    ends = [text.find(mark, start + len(heading)) for mark in ("\n## ", "\n### ")]
    return text[start : min((e for e in ends if e != -1), default=len(text))]


def test_run_saves_no_final_checkpoint_and_the_readme_says_so(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    config = TrainerConfig(lr=1e-3, checkpoint=CheckpointConfig(dir=str(ckpt), every_n_steps=2))
    trainer = Trainer(tiny_llama(seed=0), make_grpo(), ListSource([mixed_items(3, seed=1)]), config)
    trainer.run(3, progress=False)
    assert sorted(p.name for p in ckpt.glob("step_*")) == ["step_00000002"]
    trainer.save_checkpoint()  # what the README tells a user to do after such a run
    assert sorted(p.name for p in ckpt.glob("step_*")) == ["step_00000002", "step_00000003"]
    section = " ".join(
        _section(README.read_text(encoding="utf-8"), "### Checkpoints and resume").split()
    )
    assert "no final checkpoint" in section and "`trainer.save_checkpoint()`" in section


def test_the_fsdp_script_does_not_require_torchruns_rank() -> None:
    section = _section(README.read_text(encoding="utf-8"), "## Multi-process training (FSDP2)")
    assert "torchrun" in section
    assert not re.search(r"os\.environ\[\s*[\"']RANK", section), (
        "os.environ['RANK'] raises KeyError under plain `python train.py`, which the section "
        "says trains on one process"
    )


def test_the_fsdp_section_says_another_world_size_takes_rank_0s_position() -> None:
    ranks = [RankState(data_state={"position": p}, rng_json=None, rng_tensors={}) for p in (5, 9)]
    loaded = LoadedCheckpoint(
        path=Path("step_00000002"),
        step=2,
        policy_version=2,
        model_state={},
        optimizer_state=None,
        scheduler_state=None,
        rng_state={"tensors": {}},
        data_state={"position": 5},
        rank_states=ranks,
    )
    assert rank_state_for(loaded, 1, 2).data_state == {"position": 9}  # same world size
    assert rank_state_for(loaded, 0, 1).data_state == {"position": 5}  # another: rank 0's
    assert rank_state_for(loaded, 2, 3).data_state == {"position": 5}
    section = " ".join(
        _section(README.read_text(encoding="utf-8"), "## Multi-process training (FSDP2)").split()
    )
    assert "every rank takes rank 0's" in section, (
        "checkpoint.rank_state_for gives every rank rank 0's RNG and data position on another "
        "world size; the section should say so"
    )

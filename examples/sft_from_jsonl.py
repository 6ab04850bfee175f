"""Offline SFT on rollouts stored as JSONL (for example the output of rejection sampling).

    python examples/rejection_sampling.py --expert --out data/expert.jsonl
    python examples/sft_from_jsonl.py --data data/expert.jsonl --steps 100

SFT in Ludic is offline RL with every weight 1: `make_sft()` pairs `ConstantCredit(1.0)` with the
masked cross-entropy of the action tokens (prompt tokens are never trained on).
`OfflineBatchSource` reads the rollouts, builds one sample per turn from the token ids they
carry and serves shuffled batches. The checkpoint's `model/` directory is a normal Hugging Face
model directory: evaluate it with `examples/tictactoe/eval.py --model ...` or continue with RL.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import tyro

from ludic.recipes import finish, load_policy, make_trainer, plot_curve, refuse_earlier_checkpoints
from ludic.recipes.count_checks import check_count_flags
from ludic.rollouts import ChatTemplateRetokenizer
from ludic.training import OfflineBatchSource, drop_parse_errors, make_sft


@dataclass(frozen=True, kw_only=True, slots=True)
class SFTConfig:
    """Supervised fine-tuning on a rollouts JSONL."""

    data: Path
    """Rollouts JSONL to imitate."""
    model: str | None = None
    """Local model directory or hub id (default: a fresh tiny model)."""
    steps: int = 100
    """Optimizer steps."""
    batch_size: int = 32
    """Samples (turns) per step."""
    lr: float = 3e-3
    """Learning rate (3e-3 suits the tiny model; use ~1e-5 for a real LLM)."""
    retokenize: bool = False
    """Rebuild token ids with this model's chat template (data from another tokenizer or from
    a server that returned no ids)."""
    seed: int = 0
    """Seeds shuffling and training."""
    out_dir: Path = Path("ludic_runs/sft_from_jsonl")
    """Where metrics.jsonl, checkpoints and loss_curve.png go (refused when it holds an earlier
    run's checkpoints, as `ludic sft` refuses it without --resume)."""


def main(cfg: SFTConfig) -> list[dict[str, float]]:
    check_count_flags(  # --steps 0 saved a step-0 checkpoint that refused the next run
        ("--steps", cfg.steps, "optimizer steps, e.g. 100"),
        ("--batch-size", cfg.batch_size, "samples per step, e.g. 32"),
    )
    if not cfg.data.is_file():
        raise FileNotFoundError(
            f"--data {cfg.data} is not a file (expected a rollouts JSONL, e.g. from "
            f"`python examples/rejection_sampling.py --expert --out {cfg.data}`)"
        )
    # Before the model loads: a second run here would overwrite the first one's checkpoints.
    refuse_earlier_checkpoints(
        cfg.out_dir, fix=f"Pass another --out-dir for a new run (or delete {cfg.out_dir})."
    )
    model, tokenizer = load_policy(cfg.model, seed=cfg.seed)
    algorithm = make_sft()
    source = OfflineBatchSource(
        paths=cfg.data,
        credit_assigner=algorithm.credit_assigner,  # every turn weighs 1.0
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        filters=[drop_parse_errors()],  # never imitate a reply the parser rejected
        retokenizer=ChatTemplateRetokenizer(tokenizer=tokenizer) if cfg.retokenize else None,
    )
    print(f"{len(source.samples)} samples from {source.num_rollouts} rollouts")
    trainer = make_trainer(
        model, tokenizer, algorithm, source, out=cfg.out_dir, lr=cfg.lr, seed=cfg.seed
    )
    history = asyncio.run(trainer.train(cfg.steps))
    checkpoint = finish(trainer)
    plot_curve(cfg.out_dir / "metrics.jsonl", cfg.out_dir / "loss_curve.png", "loss")
    print(
        f"loss {history[0]['loss']:.3f} -> {history[-1]['loss']:.3f}; model: {checkpoint / 'model'}"
    )
    return history


if __name__ == "__main__":
    main(tyro.cli(SFTConfig))

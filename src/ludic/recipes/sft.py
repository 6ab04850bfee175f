"""`ludic sft`: supervised fine-tuning on stored rollouts (SFT = offline RL with weight 1), or
advantage-weighted regression with `--algorithm awr`.

Reads a rollouts JSONL with `OfflineBatchSource`, trains with `make_sft()` (NLL of the action
tokens only) or `make_awr()` (the same NLL, each turn weighted by exp(A / beta)), logs metrics,
saves checkpoints whose `model/` directory is a loadable model, and plots the loss curve. AWR's
weights are computed on every episode of the file before `--min-reward` drops episodes, so
`--algorithm awr --min-reward R` is rejection sampling reweighted by AWR (filter then
reweight); the `--awr-*` flags with `--algorithm sft` are refused, not ignored. It holds
OUT_DIR's run lock (`ludic.recipes.run_lock`, the one `ludic train` and `ludic quickstart`
hold) for the whole run, so a second run into the same directory is refused before its model
loads. `--checkpoint-every N` saves checkpoints that `--resume` continues from, to the same
final weights as an uninterrupted run (`ludic.recipes.sft_resume`). It does not generate data:
see `examples/rejection_sampling.py`.
"""

from __future__ import annotations

import asyncio
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TypeVar

import torch
from rich.console import Console
from transformers import PreTrainedTokenizerBase

from ludic.recipes.configs import SFTConfig
from ludic.recipes.run_lock import LUDIC_RUN, RUN_LOCK, check_run_lock, run_lock
from ludic.recipes.sft_resume import (
    SFT_SETTINGS_KEY,
    check_sft_counts,
    check_sft_resume_settings,
    check_sft_run_dir,
    resume_sft,
    sft_settings,
)
from ludic.recipes.training import (
    finish,
    load_policy,
    make_trainer,
    plot_curve,
    plural,
)
from ludic.rollouts import ChatTemplateRetokenizer, SampleFilter, SAWItem, iter_rollouts_jsonl
from ludic.rollouts.token_check import foreign_token_ids
from ludic.training import (
    OfflineBatchSource,
    RLAlgorithm,
    UnreadOptionWarning,
    drop_parse_errors,
    make_awr,
    make_sft,
)
from ludic.training.credit.awr import UnreadAWROptionError, check_baseline_options
from ludic.types import Rollout, Turn


@dataclass(frozen=True, kw_only=True, slots=True)
class SFTResult:
    """Where the run's outputs are, and its first and last loss."""

    checkpoint: Path
    metrics_jsonl: Path
    first_loss: float
    last_loss: float
    steps: int


def min_episode_return(threshold: float) -> SampleFilter:
    """Keep samples from episodes whose total reward is at least `threshold`."""

    def keep(item: SAWItem) -> bool:
        return float(item.meta.get("episode_return", float("-inf"))) >= threshold

    return keep


def trained_turns(min_reward: float | None) -> Callable[[Rollout, Turn], bool]:
    """The turns `sft_command`'s filters keep (`drop_parse_errors`, `--min-reward`), decided
    on the rollout, for `AWRCredit.trained`: per-state normalisation counts only these."""

    def trained(rollout: Rollout, turn: Turn) -> bool:
        if min_reward is not None and rollout.total_reward < min_reward:
            return False
        return not turn_has_parse_error(turn)

    return trained


def turn_has_parse_error(turn: Turn) -> bool:
    """What the sample built from `turn` records as `meta["parse_error"]`: the parser rejected
    an env action, or a step's or the env step's info says `parse_error`."""
    for step in turn.agent_steps:
        parsed = step.parse_result
        if step.action_target == "env" and parsed is not None and not parsed.ok:
            return True
        if step.info.get("parse_error", False):
            return True
    return turn.env_step is not None and bool(turn.env_step.info.get("parse_error", False))


def sft_command(cfg: SFTConfig, *, console: Console | None = None) -> SFTResult:
    """Fine-tune `cfg.model` (default: a fresh tiny model) on `cfg.data`; see `SFTConfig`."""
    console = console or Console()
    check_sft_counts(cfg)
    if not cfg.data.is_file():
        raise FileNotFoundError(f"--data {cfg.data} is not a file (expected a rollouts JSONL)")
    algorithm = offline_algorithm(cfg)  # --awr-* flags with --algorithm sft: refused
    lock = cfg.out_dir / RUN_LOCK
    check_run_lock(lock, what=LUDIC_RUN)  # another live run in OUT_DIR: before the model loads
    check_sft_run_dir(cfg)  # earlier checkpoints without --resume; --resume PATH behind them
    check_sft_resume_settings(  # --resume with other flags than the checkpoint's: refused
        cfg, lambda text: console.print(f"[yellow]note[/yellow]: --resume: {text}")
    )
    with run_lock(  # one run per OUT_DIR: a second one is refused, naming this one
        lock, what=LUDIC_RUN, notice=lambda text: console.print(f"run directory: {text}")
    ):
        return _fine_tune(cfg, algorithm, console)


def _fine_tune(cfg: SFTConfig, algorithm: RLAlgorithm, console: Console) -> SFTResult:
    """`sft_command`'s run, under OUT_DIR's lock."""
    # the data first where no tokenizer is needed: a damaged line is named before a large
    # model spends minutes loading (--retokenize rebuilds ids with the model's tokenizer)
    data = None if cfg.retokenize else _read_data(cfg, algorithm, None)
    model, tokenizer = load_policy(cfg.model, seed=cfg.seed, device=cfg.device)
    source = _offline_source(cfg, algorithm, model, tokenizer, console, data)
    trainer = make_trainer(
        model,
        tokenizer,
        algorithm,
        source,
        out=cfg.out_dir,
        lr=cfg.lr,
        seed=cfg.seed,
        checkpoint_every=cfg.checkpoint_every,
        keep_checkpoints=cfg.keep_checkpoints,
        micro_batch_tokens=cfg.micro_batch_tokens,
        device=cfg.device,
    )
    trainer.checkpoint_extra[SFT_SETTINGS_KEY] = sft_settings(cfg)
    if cfg.resume is not None:
        resume_sft(trainer, source, cfg)
        console.print(
            f"resumed at step {trainer.step} (epoch {source.epoch}, {source.position} of its "
            f"{len(source.samples)} samples served): {plural(cfg.steps - trainer.step, 'step')} "
            "left"
        )
    resumed_at = trainer.step
    history = asyncio.run(trainer.train(cfg.steps - resumed_at, progress=cfg.progress))
    checkpoint = finish(trainer)
    if not history:
        raise RuntimeError("SFT ran no step: the data gave no batch")
    metrics = cfg.out_dir / "metrics.jsonl"
    curve = plot_curve(metrics, cfg.out_dir / "loss_curve.png", "loss")
    first, last = float(history[0]["loss"]), float(history[-1]["loss"])
    console.print(
        f"{algorithm.name.upper()} done: loss {first:.3f} -> {last:.3f} over "
        f"{plural(len(history), 'step')}{_launch(resumed_at, len(history))}. Model: "
        f"[bold]{checkpoint / 'model'}[/bold]; curve: {curve}"
    )
    return SFTResult(
        checkpoint=checkpoint,
        metrics_jsonl=metrics,
        first_loss=first,
        last_loss=last,
        steps=len(history),
    )


def _offline_source(
    cfg: SFTConfig,
    algorithm: RLAlgorithm,
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    console: Console,
    source: OfflineBatchSource | None,
) -> OfflineBatchSource:
    """The data (`source`, read before the model loaded, or read now with the model's
    tokenizer), checked against the model's tokenizer, with a line saying how much of it
    trains."""
    source = source or _read_data(cfg, algorithm, tokenizer)
    _check_vocab(source, model, cfg.data)
    if not cfg.retokenize:
        _check_token_ids(cfg.data, tokenizer)
    _report_weights(source, algorithm, console)
    console.print(
        f"{algorithm.name.upper()} on {len(source.samples)} samples from {source.num_rollouts} "
        f"rollouts ({source.num_filtered_out} filtered out{_unbuildable(source)})"
    )
    return source


def _unbuildable(source: OfflineBatchSource) -> str:
    """ ", 2 rollouts dropped as unbuildable" when stored rollouts could not be turned into
    samples (named in a warning as they were read), so the summary counts every dropped one."""
    if not source.num_build_failed:
        return ""
    return f", {plural(source.num_build_failed, 'rollout')} dropped as unbuildable"


def _read_data(
    cfg: SFTConfig, algorithm: RLAlgorithm, tokenizer: PreTrainedTokenizerBase | None
) -> OfflineBatchSource:
    """The data, filtered (`drop_parse_errors`, `--min-reward`) and credited; with
    `--retokenize`, its ids rebuilt by `tokenizer`'s chat template."""
    filters: list[SampleFilter] = [drop_parse_errors()]
    if cfg.min_reward is not None:
        filters.append(min_episode_return(cfg.min_reward))
    retokenizer = None
    if cfg.retokenize and tokenizer is not None:
        retokenizer = ChatTemplateRetokenizer(tokenizer=tokenizer)
    return OfflineBatchSource(
        paths=cfg.data,
        credit_assigner=algorithm.credit_assigner,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        num_epochs=cfg.epochs,
        filters=filters,
        retokenizer=retokenizer,
    )


def _launch(resumed_at: int, launched: int) -> str:
    """After a resume, which steps this launch trained: ", steps 21-30 of this launch
    (resumed at step 20)"; nothing for a run from step 0."""
    if resumed_at == 0:
        return ""
    end = resumed_at + launched
    steps = f"step {end}" if launched == 1 else f"steps {resumed_at + 1}-{end}"
    return f", {steps} of this launch (resumed at step {resumed_at})"


def offline_algorithm(cfg: SFTConfig) -> RLAlgorithm:
    """The preset `--algorithm` names: `make_sft()` or `make_awr(...)` with the AWR flags."""
    if cfg.algorithm == "sft":
        given = awr_flags_given(cfg)
        if given:
            them, apply = ("it", "applies") if len(given) == 1 else ("them", "apply")
            raise ValueError(
                f"{' '.join(given)} {apply} only to --algorithm awr, not 'sft' (which would "
                f"ignore {them}): drop {them} or pass --algorithm awr"
            )
        return make_sft()
    if cfg.algorithm == "awr":
        normalizes = cfg.awr_state_normalize or cfg.awr_normalize_mean or cfg.awr_min_weight > 0
        state_prior = _given(cfg.awr_state_prior, "awr_state_prior")
        value_folds = _given(cfg.awr_value_folds, "awr_value_folds")
        options = {"state_prior": state_prior, "value_folds": value_folds}
        try:
            with warnings.catch_warnings():  # make_awr only warns; a typed flag is refused below
                warnings.simplefilter("ignore", UnreadOptionWarning)
                algorithm = make_awr(
                    beta=cfg.awr_beta,
                    max_weight=cfg.awr_max_weight,
                    baseline=cfg.awr_baseline,
                    state_prior=state_prior,
                    state_normalize=cfg.awr_state_normalize,
                    trained=trained_turns(cfg.min_reward) if normalizes else None,
                    value_folds=value_folds,
                    normalize_mean=cfg.awr_normalize_mean,
                    min_weight=cfg.awr_min_weight,
                )
            check_baseline_options(
                cfg.awr_baseline, {k: v for k, v in options.items() if v is not None}
            )
            return algorithm
        except UnreadAWROptionError as e:  # a flag the baseline ignores, named as typed
            field = f"awr_{e.option}"
            raise ValueError(
                f"{_flag(field)} {getattr(cfg, field)} applies only to --awr-baseline "
                f"{' or '.join(e.readers)}, not {e.baseline!r} (which would ignore it): drop it "
                f"or pass --awr-baseline {e.readers[0]}"
            ) from e
        except ValueError as e:
            raise ValueError(_name_awr_flag(str(e), cfg)) from e
    raise ValueError(f"--algorithm must be 'sft' or 'awr', got {cfg.algorithm!r}")


_DEFAULTS = {f.name: f.default for f in fields(SFTConfig)}
_T = TypeVar("_T")


def _given(value: _T, field_name: str) -> _T | None:
    """`value`, or None (not given: `make_awr`'s default) when it is the flag's default, so
    that `make_awr` refuses only a baseline-specific flag that was set."""
    return None if value == _DEFAULTS[field_name] else value


_AWR_CHECK = re.compile(r"^AWRCredit: (\w+) ")


def _name_awr_flag(message: str, cfg: SFTConfig) -> str:
    """An `AWRCredit` check's message with the field it names (and any other field it quotes
    as `name=`) written as the `--awr-*` flag that sets it: "--awr-min-weight 30.0: must be in
    [0, --awr-max-weight 20.0], got 30.0". A message about no such field is returned as is."""
    found = _AWR_CHECK.match(message)
    if found is None or not hasattr(cfg, f"awr_{found[1]}"):
        return message
    rest = message[found.end() :]
    for f in fields(SFTConfig):
        if f.name.startswith("awr_"):
            rest = rest.replace(f"{f.name[4:]}=", f"{_flag(f.name)} ")
    return f"{_flag('awr_' + found[1])} {getattr(cfg, 'awr_' + found[1])}: {rest}"


def _flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def awr_flags_given(cfg: SFTConfig) -> list[str]:
    """The `--awr-*` flags whose value differs from the default, as typed: `--flag value`, or
    `--flag` / `--no-flag` for a switch."""
    given = []
    for f in fields(SFTConfig):
        value = getattr(cfg, f.name)
        if f.name.startswith("awr_") and value != f.default:
            flag = f.name.replace("_", "-")
            if isinstance(value, bool):
                given.append(f"--{flag}" if value else f"--no-{flag}")
            else:
                given.append(f"--{flag} {value}")
    return given


def _report_weights(source: OfflineBatchSource, algorithm: RLAlgorithm, console: Console) -> None:
    """AWR on data whose weights are all equal is plain SFT: say so, it is rarely intended."""
    if algorithm.name != "awr" or not source.samples:
        return
    weights = [float(s.weight) for s in source.samples]
    console.print(
        f"AWR weights: min {min(weights):.3g}, mean {sum(weights) / len(weights):.3g}, "
        f"max {max(weights):.3g}"
    )
    if max(weights) == min(weights):
        console.print(
            "[yellow]warning[/yellow]: every AWR weight is equal, so this is plain SFT: the "
            "data has no reward differences within a group (use --awr-baseline mean, or data "
            "with both good and bad episodes)"
        )


def _check_vocab(source: OfflineBatchSource, model: torch.nn.Module, data: Path) -> None:
    """Token ids from another tokenizer would index past the embedding, and a negative one
    (a damaged file) from its end: say so up front."""
    vocab = int(model.get_input_embeddings().weight.shape[0])  # type: ignore[operator]
    negative = next((s for s in source.samples if min(s.input_ids) < 0), None)
    if negative is not None:
        raise ValueError(
            f"{data}: rollout {negative.meta.get('rollout_id')!r} holds token id "
            f"{min(negative.input_ids)}, and token ids are >= 0: the file is damaged or was "
            "edited. Drop that rollout's line, or pass --retokenize to rebuild the ids from "
            "the messages with this model's chat template"
        )
    top = max(max(s.input_ids) for s in source.samples)
    if top >= vocab:
        raise ValueError(
            f"the data holds token id {top} but the model's vocabulary has {vocab} entries: the "
            "rollouts were tokenized by another tokenizer. Pass --retokenize to rebuild the ids "
            "from the messages with this model's chat template"
        )


def _check_token_ids(
    data: Path, tokenizer: PreTrainedTokenizerBase, *, max_checked: int = 16
) -> None:
    """Ids from a smaller tokenizer pass `_check_vocab` and train on nonsense: refuse data
    whose first completions (up to `max_checked`) none decode, with this model's tokenizer,
    to text containing what the rollout recorded (a stop string may be cut from the text)."""
    foreign = foreign_token_ids(  # the check `ludic view --tokenizer` makes too
        iter_rollouts_jsonl(data),
        [
            lambda ids: str(tokenizer.decode(list(ids), skip_special_tokens=True)),
            lambda ids: str(tokenizer.decode(list(ids))),  # special tokens kept
        ],
        max_checked=max_checked,
    )
    if foreign is not None:
        whose = "this model's tokenizer's"
        raise ValueError(
            f"{foreign.describe(str(data), whose)}. Pass "
            "--model with the model directory whose tokenizer made them, or --retokenize to "
            "rebuild the ids from the messages with this model's chat template"
        )

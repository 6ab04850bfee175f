"""The wiring every training program repeats, as public helpers (`from ludic.recipes import
...`): load a policy (`load_policy`), serve it in process or from servers with the matching
weight publisher (`make_inference`, from `ludic.recipes.inference`), a Trainer with a JSONL metrics log and checkpoints that
hold the tokenizer in one output directory (`make_trainer`), the training samples written
for `ludic view --samples` (`log_samples`), a final checkpoint (`finish`), the closing
line's rewards by step (`launch_rewards`) and a curve (`plot_curve`). `ludic train` and the examples use them.
`ludic train` and `ludic sft` share their `--out-dir` / `--resume` checks here
(`check_run_dir` and `resume_target`, from `ludic.recipes.run_dir`; `recorded_settings`,
`refuse_other_settings`); each command compares its own recorded flags.

Plain functions over public components; they add no behaviour of their own and hide no loop:
`trainer.train(steps)` is the loop.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import torch

from ludic._resumed_log import ResumedLog, batch_index_of, meta_batch_index
from ludic.distributed import PolicyPublisher
from ludic.errors import Refusal
from ludic.recipes.inference import Inference as Inference  # re-exported from its module
from ludic.recipes.inference import make_inference as make_inference
from ludic.recipes.resume_refusal import CHECKPOINTS_DIR as CHECKPOINTS_DIR
from ludic.recipes.run_dir import check_resume_dir as check_resume_dir
from ludic.recipes.run_dir import check_run_dir as check_run_dir
from ludic.recipes.run_dir import refuse_earlier_checkpoints as refuse_earlier_checkpoints
from ludic.recipes.run_dir import resume_target as resume_target
from ludic.recipes.wrapped_source import WrappedSource
from ludic.rollouts import every_episode_failed
from ludic.training import (
    BatchSource,
    CheckpointConfig,
    JsonlLogger,
    RLAlgorithm,
    SAWBatch,
    Trainer,
    TrainerConfig,
)
from ludic.training.checkpoint import (
    STATE,
)
from ludic.training.config import DType
from ludic.training.schedule import LR_SCHEDULES, LRSchedule

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"


def make_trainer(
    model: torch.nn.Module,
    tokenizer: Any,
    algorithm: RLAlgorithm,
    source: BatchSource,
    *,
    out: str | Path,
    lr: float,
    lr_schedule: LRSchedule = "constant",
    warmup_steps: int = 0,
    schedule_steps: int | None = None,
    min_lr_ratio: float = 0.0,
    seed: int = 0,
    publisher: PolicyPublisher | None = None,
    initial_policy_version: int = 0,
    max_lag: int = 0,
    checkpoint_every: int | None = None,
    keep_checkpoints: int | None = 2,
    micro_batch_tokens: int | None = None,
    device: str = "cpu",
    dtype: DType = "float32",
    batch_invariant: bool = False,
) -> Trainer:
    """A Trainer logging to `out/metrics.jsonl` and checkpointing under `out/checkpoints`
    (every `checkpoint_every` steps, the newest `keep_checkpoints` kept, None: all; the
    tokenizer is saved with the model
    so a checkpoint's `model/` directory loads with `ludic.models.load_model`).
    The learning rate warms up linearly over `warmup_steps`, then follows `lr_schedule`
    (cosine or linear: down to `min_lr_ratio * lr` over `schedule_steps` optimizer steps;
    `ludic.training.schedule`); the schedule's position is checkpointed, so a resumed run
    continues on the same curve. `dtype` is the forward pass's autocast dtype
    (`TrainerConfig.dtype`; weights and optimizer state stay as loaded). `batch_invariant` recomputes logprobs with the
    batch-invariant engine's arithmetic (`TrainerConfig.batch_invariant`). With a
    `publisher`, samples more than `max_lag` policy versions old are dropped (0: on-policy;
    1 or more when the next batch is generated during the optimizer step)."""
    check_lr_schedule(lr_schedule, warmup_steps, schedule_steps, min_lr_ratio)
    out = Path(out)  # "runs/x" works as well as Path("runs/x")
    out.mkdir(parents=True, exist_ok=True)
    config = TrainerConfig(
        lr=lr,
        lr_schedule=lr_schedule,
        warmup_steps=warmup_steps,
        total_steps=schedule_steps,
        min_lr_ratio=min_lr_ratio,
        seed=seed,
        pad_token_id=int(tokenizer.pad_token_id or 0),
        initial_policy_version=initial_policy_version,
        max_lag=max_lag if publisher is not None else None,
        micro_batch_tokens=micro_batch_tokens,
        device=device,
        dtype=dtype,
        batch_invariant=batch_invariant,
        checkpoint=CheckpointConfig(
            dir=str(out / CHECKPOINTS_DIR),
            every_n_steps=checkpoint_every,
            keep_last=keep_checkpoints,
        ),
    )
    return Trainer(
        model,
        algorithm,
        source,
        config,
        publisher=publisher,
        # Rank 0 alone writes it (under torchrun every rank logs the same all-rank step).
        logger=JsonlLogger(out / METRICS_FILE) if int(os.environ.get("RANK", "0")) == 0 else None,
        tokenizer=tokenizer,
    )


def check_lr_schedule(
    lr_schedule: str, warmup_steps: int, schedule_steps: int | None, min_lr_ratio: float
) -> None:
    """Refuse schedule settings `make_trainer` cannot follow, naming the `ludic train` flag."""
    if lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"--lr-schedule must be one of {LR_SCHEDULES}, got {lr_schedule!r}")
    if warmup_steps < 0:
        raise ValueError(f"--warmup-steps must be >= 0, got {warmup_steps}")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"--min-lr-ratio must be in [0, 1], got {min_lr_ratio}")
    if lr_schedule != "constant" and (schedule_steps is None or schedule_steps < 1):
        raise ValueError(
            f"--lr-schedule {lr_schedule} decays over --schedule-steps optimizer steps, which "
            f"must be >= 1 (got {schedule_steps}); ludic train defaults it to --steps"
        )
    if lr_schedule != "constant" and schedule_steps is not None and warmup_steps >= schedule_steps:
        raise ValueError(
            f"--lr-schedule {lr_schedule} decays after --warmup-steps {warmup_steps} until "
            f"--schedule-steps {schedule_steps} (default: --steps), which leaves nothing to decay "
            f"over: give a --schedule-steps (or --steps) larger than --warmup-steps, or a shorter "
            f"warmup"
        )


SETTINGS_KEYS: dict[str, str] = {"ludic train": "run_settings", "ludic sft": "sft_settings"}
"""Per command, the key of a checkpoint's state.json `extra` under which it records the flags
that decide what its run trains, so that `--resume` can refuse other ones (and another
command's checkpoint)."""


def recorded_settings(
    out_dir: Path,
    resume: str | None,
    *,
    command: str,
    flags: str,
    notice: Callable[[str], None],
) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint `--resume` names and the settings `command` recorded in it (under
    `SETTINGS_KEYS[command]`), to compare with this launch's. None when there is nothing to
    compare: no checkpoint or a broken one (the trainer refuses it with its own message), or
    one saved before the record existed (a one-line `notice` says so; `flags` names what
    goes unchecked). Another command's checkpoint raises ValueError naming that command and
    the fix."""
    path = resume_target(out_dir, resume)
    if path is None:
        return None
    try:
        extra = json.loads((path / STATE).read_text()).get("extra", {})
    except (OSError, ValueError, AttributeError):
        return None  # a broken checkpoint: the trainer refuses it with its own message
    saved = extra.get(SETTINGS_KEYS[command])
    if isinstance(saved, dict):
        return path, saved
    for other, key in SETTINGS_KEYS.items():
        if other != command and key in extra:
            raise ValueError(
                f"--resume: {path} is a `{other}` checkpoint; `{command} --resume` continues a "
                f"`{command}` run. To train from its weights with `{command}`, start a new run "
                f"with --model {path / 'model'} and another --out-dir"
            )
    notice(
        f"{path} does not record its run's {flags} (saved by an older ludic): resuming "
        "without checking that they match"
    )
    return None


def refuse_other_settings(path: Path, parts: list[str], keep: str) -> NoReturn:
    """Raise the `--resume` refusal of a checkpoint trained with other flags: `parts` says
    each flag's two values, `keep` is the checkpoint's flags to pass instead."""
    raise ValueError(
        f"--resume: {path} was trained with other settings: {'; '.join(parts)}. Resuming would "
        f"train a different run into the same logs. Pass the checkpoint's flags ({keep}) to "
        "continue it, or another --out-dir to start a new run."
    )


def finish(trainer: Trainer) -> Path:
    """Save a final checkpoint (unless this step was just saved) and close the logger."""
    assert trainer.checkpoints is not None
    path = trainer.checkpoints.path_for(trainer.step)
    if not trainer.checkpoints.due(trainer.step) or not path.exists():
        path = trainer.save_checkpoint()
    trainer.close()
    return path


def launch_rewards(first: float, last: float, checkpoint: Path, launched: int) -> str:
    """The first and last step's mean reward of this launch, each with its step number, and
    after a resume which steps this launch trained, e.g. "+0.100 (step 21) -> +0.400 (step 30),
    steps 21-30 of this launch (resumed at step 20)". `checkpoint` is what `finish` returned
    (it is saved at the last step) and `launched` the number of steps this launch trained."""
    end = _checkpoint_step(checkpoint)
    if end is None:
        return f"{first:+.3f} (first step) -> {last:+.3f} (last step)"
    start = end - launched
    text = f"{first:+.3f} (step {start + 1}) -> {last:+.3f} (step {end})"
    if start == 0:
        return text
    steps = f"step {end}" if launched == 1 else f"steps {start + 1}-{end}"
    return f"{text}, {steps} of this launch (resumed at step {start})"


def closing_rewards(history: list[dict[str, float]], checkpoint: Path) -> tuple[str, float, float]:
    """`launch_rewards` over a launch's metrics `history`, counting only steps that had a
    successful episode: a step whose every episode failed logs batch/mean_reward 0.0, a reward
    no episode earned (`ludic plot` leaves it a gap by the same rule). Returns the text and the
    (first, last) rewards quoted, NaN when no step had a successful episode."""
    rewarded = [i for i, m in enumerate(history) if not every_episode_failed(m)]
    if not rewarded:
        return "unknown: no step had a successful episode", math.nan, math.nan
    i, j = rewarded[0], rewarded[-1]
    first, last = history[i]["batch/mean_reward"], history[j]["batch/mean_reward"]
    if (i, j) == (0, len(history) - 1):
        return launch_rewards(first, last, checkpoint, len(history)), first, last
    end = _checkpoint_step(checkpoint)
    start = (len(history) if end is None else end) - len(history)  # None: steps of this launch
    none = len(history) - len(rewarded)
    return (
        f"{first:+.3f} (step {start + i + 1}) -> {last:+.3f} (step {start + j + 1}), the first "
        f"and last step with a successful episode ({plural(none, 'step')} of this launch had "
        "none)",
        first,
        last,
    )


def _checkpoint_step(checkpoint: Path) -> int | None:
    """The step a `step_N` checkpoint folder was saved at (None for another name)."""
    try:
        return int(checkpoint.name.removeprefix("step_"))
    except ValueError:
        return None


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """`count` and the noun in the number it takes: plural(1, "step") is "1 step",
    plural(0, "step") "0 steps"; `nouns` is the plural when it is not `noun` + "s"."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"


def load_policy(model: str | None, *, seed: int = 0, device: str = "cpu") -> tuple[Any, Any]:
    """(model in fp32, tokenizer): a fresh tiny model (None), a local model directory (or a
    checkpoint step folder: its `model/`), or a Hugging Face hub id such as
    "Qwen/Qwen2.5-0.5B-Instruct" (downloaded by transformers, so it needs network; Ludic itself
    never fetches anything). A path that looks local (`local_path_reason`) and is not
    there is refused at once, never tried on the hub."""
    from ludic.models import build_tiny_model, load_model

    if model is None:
        tiny, tokenizer = build_tiny_model(seed=seed)
        tiny.to(device)  # type: ignore[arg-type]  # the embedded engine serves on this device
        return tiny, tokenizer
    local = local_path_reason(model)
    if local is not None:
        if not Path(model).expanduser().exists():
            raise FileNotFoundError(
                f"no model directory at {model} (read as a local path: {local}); check the "
                "path, or pass a hub id as 'org/name'"
            )
        return load_model(model, dtype=torch.float32, device=device)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        loaded = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(model)
    except Exception as e:
        if not (isinstance(e, OSError) or _network_error(e)):
            raise
        said = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise HubModelUnavailable(
            f"--model {model} reads as a Hugging Face hub id ('org/name') and could not be "
            f"loaded from the hub: {said.rstrip('.')}. Pass a local model directory (Ludic itself needs no "
            "network: `ludic.models` builds tiny ones), or run where huggingface.co is "
            "reachable; a model already in the local cache loads with HF_HUB_OFFLINE=1"
        ) from e
    loaded.to(device)  # type: ignore[arg-type]  # transformers' decorated `to` confuses mypy
    return loaded.eval(), tokenizer


class HubModelUnavailable(Refusal, OSError):
    """`--model` read as a hub id that could not be loaded: no network, or no such model."""


def _network_error(e: BaseException) -> bool:
    """Whether `e` or an exception it came from is a failed connection (httpx, requests and
    urllib3 name theirs ConnectError / ConnectionError / ...Timeout; none is an OSError)."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, OSError) or type(seen).__name__.endswith(
            ("ConnectError", "ConnectionError", "Timeout", "TimeoutError")
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def local_path_reason(model: str) -> str | None:
    """None when `--model` reads as a hub id ("org/name"), else why it is a local path: it
    exists, starts with `/`, `.` or `~`, has no `/` or more than one, or its first component
    is a local directory (so a mistyped `runs/x` is not sent to the hub)."""
    if Path(model).expanduser().exists():
        return "it exists"
    if model.startswith(("/", ".", "~")) or "\\" in model:
        return f"it starts with {model[0]!r}" if model[0] in "/.~" else "it holds a backslash"
    if model.count("/") != 1:
        return "a hub id has exactly one '/'"
    org, name = model.split("/")
    if not org or not name:
        return "a hub id is 'org/name'"
    if Path(org).is_dir():
        return f"{org}/ is a local directory"
    return None


def plot_curve(metrics_jsonl: Path, png: Path, key: str, *, smooth: float = 0.6) -> Path:
    """Plot `key` against step from a metrics JSONL into `png` (with an EMA over raw values)."""
    from ludic.viz import plot_metrics

    plot_metrics(metrics_jsonl, png, keys=(key,), smooth=smooth)
    return png


class SampleLog(WrappedSource):
    """A BatchSource that passes `source`'s batches through and appends every training sample
    to `path` as one `SAWItem.to_dict()` line (what `ludic view --samples` reads). Its
    checkpoint state is the wrapped source's. The first batch whose samples carry
    `meta["batch_index"]` (`RolloutBatchSource` stamps it) drops the file's samples of that
    batch and later ones: a run resumed from a checkpoint draws them again."""

    def __init__(self, source: BatchSource, path: Path) -> None:
        self.source = source
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._resumed = ResumedLog(self.path, batch_index_of)

    async def next_batch(self) -> SAWBatch:
        batch = await self.source.next_batch()
        if batch.items:
            self._resumed.before_write(meta_batch_index(batch.items[0].meta))
        lines = [json.dumps(item.to_dict()) + "\n" for item in batch.items]
        with self.path.open("a", encoding="utf-8") as f:
            f.write("".join(lines))
        return batch


def log_samples(source: BatchSource, out: Path) -> SampleLog:
    """`source`, writing its training samples to `out/samples.jsonl` as they are drawn."""
    return SampleLog(source, Path(out) / SAMPLES_FILE)


__all__ = [
    "CHECKPOINTS_DIR",
    "METRICS_FILE",
    "SAMPLES_FILE",
    "SETTINGS_KEYS",
    "HubModelUnavailable",
    "Inference",
    "SampleLog",
    "check_resume_dir",
    "check_run_dir",
    "finish",
    "load_policy",
    "local_path_reason",
    "log_samples",
    "make_inference",
    "make_trainer",
    "plot_curve",
    "plural",
    "recorded_settings",
    "refuse_earlier_checkpoints",
    "refuse_other_settings",
    "resume_target",
]

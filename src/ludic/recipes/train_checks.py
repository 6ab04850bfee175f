"""`ludic train`'s up-front refusals of flags that cannot train, and the run settings a
checkpoint records so that `--resume` continues the same run.

Counts (`--steps`, `--problems-per-step`, `--group-size`, and when given `--checkpoint-every`
and `--micro-batch-tokens`) must be >= 1 and `--lr` a finite number > 0, and a preset whose
baseline is its group's mean (GRPO and its variants, RLOO, GiGPO, REINFORCE with a group
baseline, AWR's group baseline) needs `--group-size` >= 2: with one episode per group every
advantage is 0. `--temperature 0` (greedy) is refused with such a preset (every episode of a
group is the same completion, so again every advantage is 0) and with a ratio loss (the
importance ratio assumes sampled completions; a greedy one is not). `ludic actor` runs the
same two checks (`check_group_size`, `check_greedy`) on its flags. `run_settings` is what each checkpoint's state.json `extra` holds under
`RUN_SETTINGS_KEY` (the env, its kwargs, the algorithm, the group size, the sampling, the
prompt and parse flags `--context`, `--parser`, `--system-prompt`, `--reject-incomplete`, and
`--seed`, from which every env and sampling seed of a batch derives; `--split-over-turns` and
`--rollout-correction.*` when on), and
`check_resume_settings` refuses a `--resume` whose flags differ from them before the model
loads, but for `--max-tokens` and `--max-steps` (they only move truncation; a notice names the
change; `--max-tokens` is kept under dr_grpo, whose loss divides by it); `--context` and
`--parser` compare what they resolve to on the env (`auto` and the name it resolves to are the
same run). It refuses a `ludic sft` checkpoint, naming the fix.
It does not check the LR flags (the trainer does: `ludic.training.lr_resume`) nor the flags
that only change speed or bookkeeping (`--problems-per-step`, `--concurrency`, ...).
"""

from __future__ import annotations

import functools
import json
import shlex
from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from typing import Any, Protocol

from ludic.parsers import Parser, identity_parser, parser_name
from ludic.recipes.configs import TrainConfig, context_of
from ludic.recipes.count_checks import (
    check_count_flags,
    check_episode_timeout,
    check_lr,
    check_micro_batch_tokens,
)
from ludic.recipes.rollout_correction_flags import OFF_SETTINGS as CORRECTION_OFF
from ludic.recipes.training import SETTINGS_KEYS, recorded_settings, refuse_other_settings
from ludic.training.algorithm_types import RLAlgorithm

RUN_SETTINGS_KEY = SETTINGS_KEYS["ludic train"]
"""Key of `run_settings` in a checkpoint's state.json `extra`."""


def check_counts(cfg: TrainConfig) -> None:
    """Refuse `--steps`, `--problems-per-step` or `--group-size` below 1, a `--checkpoint-every`
    or `--micro-batch-tokens` below 1, an `--lr` that is not a finite number > 0, and LR-decay
    flags a constant schedule ignores (`check_constant_schedule_flags`), naming the flag, before
    the model loads (the trainer refused the --lr, --checkpoint-every and --micro-batch-tokens
    ones only after it had loaded, naming its own fields: `lr must be > 0`)."""
    check_count_flags(
        ("--steps", cfg.steps, "optimizer steps of the whole run, e.g. --steps 50"),
        ("--problems-per-step", cfg.problems_per_step, "problems per step, e.g. 4"),
        ("--group-size", cfg.group_size, "episodes per problem, e.g. 8"),
    )
    for flag, value, fix in (
        ("--checkpoint-every", cfg.checkpoint_every, "or leave it out: a final one is saved"),
        ("--keep-checkpoints", cfg.keep_checkpoints, "or None: keep every one"),
    ):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value} ({fix})")
    check_micro_batch_tokens(cfg.micro_batch_tokens)  # a token budget, in its own words
    check_lr(cfg.lr, "1e-4")
    check_constant_schedule_flags(cfg)
    check_episode_timeout(cfg.episode_timeout_s)


def check_constant_schedule_flags(cfg: TrainConfig) -> None:
    """Refuse `--min-lr-ratio` or `--schedule-steps` with `--lr-schedule constant`, which never
    reads them (the LR stays at --lr after the warmup): a typed flag that does nothing is surely
    a mistake (the library only warns, so that a sweep can pass them to every arm)."""
    if cfg.lr_schedule != "constant":
        return
    given = [f"--min-lr-ratio {cfg.min_lr_ratio}"] if cfg.min_lr_ratio != 0.0 else []
    if cfg.schedule_steps is not None:
        given.append(f"--schedule-steps {cfg.schedule_steps}")
    if given:
        them, shape = ("it", "shapes") if len(given) == 1 else ("them", "shape")
        raise ValueError(
            f"{' and '.join(given)} only {shape} a decaying LR, and --lr-schedule constant (the "
            f"default) keeps --lr after the warmup, ignoring {them}: pass --lr-schedule cosine "
            f"or linear, or drop {them}"
        )


def group_baseline(algorithm: RLAlgorithm) -> bool:
    """Whether the preset's advantage compares each episode with the others of its group, so
    that a group of one gives every sample an advantage of 0."""
    from ludic.training.credit import (
        AWRCredit,
        GiGPO,
        GroupNormalizedReturn,
        LeaveOneOutReturn,
        ReinforcePlusPlus,
    )

    credit = algorithm.credit_assigner
    if isinstance(credit, GroupNormalizedReturn | LeaveOneOutReturn | GiGPO):
        return True
    if isinstance(credit, ReinforcePlusPlus):
        return bool(credit.group_baseline)
    return isinstance(credit, AWRCredit) and credit.baseline == "group"


class RolloutFlags(Protocol):
    """The flags of `ludic train` and `ludic actor` that decide whether a preset can learn."""

    @property
    def algorithm(self) -> str: ...

    @property
    def group_size(self) -> int: ...

    @property
    def temperature(self) -> float: ...


def ratio_loss(algorithm: RLAlgorithm) -> bool:
    """Whether the preset's loss weighs tokens by the importance ratio pi / mu against the
    behaviour policy (clipped surrogates, CISPO, GMPO, a truncated-IS REINFORCE or a rollout
    correction), looking through composite losses."""
    from ludic.training.losses import (
        CISPOLoss,
        CompositeLoss,
        GMPOLoss,
        ReinforceLoss,
        RolloutCorrection,
        SequenceClippedSurrogateLoss,
        TokenClippedSurrogateLoss,
    )

    ratios = (TokenClippedSurrogateLoss, SequenceClippedSurrogateLoss, CISPOLoss, GMPOLoss)
    pending: list[Any] = [algorithm.loss]
    while pending:
        loss = pending.pop()
        if isinstance(loss, (*ratios, RolloutCorrection)):
            return True
        if isinstance(loss, ReinforceLoss) and loss.truncated_is_cap is not None:
            return True
        if isinstance(loss, CompositeLoss):
            pending.extend(term for _, term in loss.terms)
    return False


def check_greedy(cfg: RolloutFlags, algorithm: RLAlgorithm) -> None:
    """Refuse `--temperature 0` for a preset that cannot learn from greedy rollouts: a group
    baseline (every episode of a group is the same completion, so every advantage is 0) or a
    ratio loss (it assumes completions sampled from the policy)."""
    if cfg.temperature != 0:
        return
    groups, ratios = group_baseline(algorithm), ratio_loss(algorithm)
    if not (groups or ratios):
        return
    why = []
    if groups:
        why.append(
            "every episode of a group is the same greedy completion, so each reward equals its "
            "group's baseline and every advantage is 0: nothing trains"
        )
    if ratios:
        why.append(
            "its loss weighs tokens by the importance ratio pi/mu, which assumes completions "
            "sampled from the policy, and a greedy completion is not one"
        )
    raise ValueError(
        f"--temperature 0 with --algorithm {cfg.algorithm}: {'; and '.join(why)}. Pass "
        "--temperature above 0 (e.g. 1.0, the default, or 0.7), or --algorithm reinforce"
    )


def check_group_size(cfg: RolloutFlags, algorithm: RLAlgorithm) -> None:
    """Refuse `--group-size 1` for a preset that needs a group to compare episodes."""
    if cfg.group_size == 1 and group_baseline(algorithm):
        raise ValueError(
            f"--group-size 1 with --algorithm {cfg.algorithm}: its baseline is the mean reward "
            "of each group's episodes, so with one episode per group every advantage is 0 and "
            "nothing trains. Pass --group-size 2 or more (e.g. 8), or an algorithm without a "
            "group baseline (--algorithm reinforce or reinforce_pp)"
        )


def run_settings(cfg: TrainConfig, env_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The flags that decide what a run trains, by flag name, as JSON values."""
    settings: dict[str, Any] = {
        "--env": cfg.env,
        "--env-kwargs": dict(env_kwargs),
        "--algorithm": cfg.algorithm,
        "--problems-per-step": cfg.problems_per_step,
        "--group-size": cfg.group_size,
        "--temperature": cfg.temperature,
        "--top-p": cfg.top_p,
        "--max-tokens": cfg.max_tokens,
        "--max-steps": cfg.max_steps,
        "--context": cfg.context,
        "--parser": cfg.parser,
        "--system-prompt": cfg.system_prompt,
        "--reject-incomplete": cfg.reject_incomplete,
        "--seed": cfg.seed,
    }
    if cfg.split_over_turns:  # recorded when on; off is what a run without it trained
        settings["--split-over-turns"] = True
    settings.update(cfg.rollout_correction.settings())  # the same: recorded when on
    if cfg.algorithm == "gigpo":
        for name, value in asdict(cfg.gigpo).items():
            settings[f"--gigpo.{name.replace('_', '-')}"] = value
    return dict(json.loads(json.dumps(settings)))  # as state.json gives them back


_RECORDED_WHEN_ON: dict[str, Any] = {"--split-over-turns": False, **CORRECTION_OFF}
"""Flags `run_settings` records only when on, and their values when off, so that a resume
compares them as off when absent."""

_CUTS = {"--max-tokens": "completions", "--max-steps": "episodes"}
"""The truncation flags a `--resume` may change, and what each cuts off."""


def _truncation_only(cfg: TrainConfig) -> frozenset[str]:
    """The recorded flags a `--resume` may change: `--max-tokens` and `--max-steps` only move
    where completions and episodes are cut off (the fixes the context-overflow warning
    advises), except `--max-tokens` under dr_grpo, whose loss divides by it."""
    return frozenset(f for f in _CUTS if not (f == "--max-tokens" and cfg.algorithm == "dr_grpo"))


def _value(flag: str, value: Any) -> str:
    if flag == "--env-kwargs":
        return f"'{json.dumps(value)}'"
    return shlex.quote(value) if isinstance(value, str) else str(value)


def _flag_text(flag: str, value: Any) -> str:
    """The flag as it is typed: a boolean as `--flag` / `--no-flag` (`--gigpo.no-flag`)."""
    if isinstance(value, bool):
        group, _, name = flag[2:].rpartition(".")
        return flag if value else f"--{group + '.' if group else ''}no-{name}"
    return f"{flag} {_value(flag, value)}"


Resolve = Callable[[Any], tuple[str, str]]
"""What a flag's value resolves to on this run's env: (what is compared, what a refusal shows),
e.g. `--context auto` -> ("latest", "latest")."""


def check_resume_settings(
    cfg: TrainConfig,
    env_kwargs: Mapping[str, Any],
    notice: Callable[[str], None],
    *,
    resolve: Mapping[str, Resolve] | None = None,
) -> None:
    """Refuse `--resume` when this launch's `run_settings` differ from the checkpoint's,
    naming each flag, the checkpoint's value and this launch's, and the fix. Another
    `--max-tokens` (truncation only; not under dr_grpo, whose loss divides by it) resumes with
    a one-line `notice` naming both values, as does a checkpoint saved before runs recorded
    their settings (unchecked). A flag in `resolve` (by flag name) compares what both values
    resolve to, so `--context auto` resumes a `--context latest` run when the env suggests
    latest; a refusal names what each resolved to."""
    found = recorded_settings(
        cfg.out_dir,
        cfg.resume,
        command="ludic train",
        flags="--env/--algorithm/group and sampling flags",
        notice=notice,
    )
    if found is None:
        return
    path, saved = found
    given = run_settings(cfg, env_kwargs)
    for flag, off in _RECORDED_WHEN_ON.items():  # absent: off (saved before the flag too)
        saved.setdefault(flag, off)
        given.setdefault(flag, off)
    # flags one side does not record (--gigpo.* of another algorithm) are not compared
    resolve = resolve or {}
    resolved = {f: (resolve[f](saved[f]), resolve[f](given[f])) for f in resolve if f in saved}
    changed = [
        f
        for f in given
        if f in saved
        and saved[f] != given[f]
        and (f not in resolved or resolved[f][0][0] != resolved[f][1][0])
    ]
    free = _truncation_only(cfg)
    differ = [f for f in changed if f not in free]
    if not differ:
        for f in changed:
            notice(
                f"{f} is {given[f]}, the checkpoint's {saved[f]}: continuing with {given[f]} "
                f"(it only changes where {_CUTS[f]} are cut off)"
            )
        return
    parts = [
        f"{f} is {_value(f, given[f])}, the checkpoint's {_value(f, saved[f])}"
        + (" (dr_grpo's loss normaliser)" if f == "--max-tokens" else "")
        + (_resolved_text(saved[f], given[f], *resolved[f]) if f in resolved else "")
        for f in differ
    ]
    refuse_other_settings(path, parts, " ".join(_flag_text(f, saved[f]) for f in differ))


def _resolved_text(
    saved_flag: Any, given_flag: Any, saved: tuple[str, str], given: tuple[str, str]
) -> str:
    """What the two values resolved to, unless that is what was typed; one name with other
    settings (another penalty) shows the settings."""
    shown = 1 if saved[1] != given[1] else 0
    if shown == 1 and (saved[1], given[1]) == (saved_flag, given_flag):
        return ""
    return f" (on this env: {given[shown]}, the checkpoint's {saved[shown]})"


def parser_identity(parser: Any) -> str:
    """What decides how `parser` parses, as text: its code and every setting it closes over
    (`xml_tag_parser("move", penalty=-0.5)` is not `xml_tag_parser("move")`), a callable
    object's type and attributes, a `functools.partial`'s function and arguments. Two parsers
    with the same identity parse every reply alike."""
    return _identity(parser, depth=0)


def _identity(value: Any, *, depth: int) -> str:
    if value is None or isinstance(value, str | int | float | bool):
        return repr(value)
    if depth > 8:  # a cycle, or nesting no parser needs
        return f"<{type(value).__qualname__}>"
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_identity(v, depth=depth + 1) for v in value) + "]"
    if isinstance(value, functools.partial):
        inner = [_identity(v, depth=depth + 1) for v in (value.func, *value.args)]
        keywords = [
            f"{k}={_identity(v, depth=depth + 1)}" for k, v in sorted(value.keywords.items())
        ]
        return f"partial({', '.join(inner + keywords)})"
    code = getattr(value, "__code__", None)
    if code is not None:  # a function: its code, and what it closes over
        cells = zip(code.co_freevars, getattr(value, "__closure__", None) or (), strict=True)
        bound = [f"{name}={_identity(_cell(cell), depth=depth + 1)}" for name, cell in cells]
        where = f"{getattr(value, '__module__', '?')}:{code.co_qualname}"
        return where + (f"[{', '.join(bound)}]" if bound else "")
    kind = f"{type(value).__module__}:{type(value).__qualname__}"
    attributes = getattr(value, "__dict__", None)
    if not isinstance(attributes, dict) or not attributes:
        text = repr(value)  # e.g. a compiled pattern names its regex
        return kind if " at 0x" in text else f"{kind}({text})"
    fields = [f"{k}={_identity(v, depth=depth + 1)}" for k, v in sorted(attributes.items())]
    return f"{kind}({', '.join(fields)})"


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell (a name not yet bound when the function was made)
        return None


def resume_resolvers(
    cfg: TrainConfig,
    env_factory: Callable[..., Any],
    env_kwargs: dict[str, Any],
    suggested: str | None,
    resolved_parser: Parser,
) -> dict[str, Resolve]:
    """For `check_resume_settings`: what a recorded --context or --parser resolves to on this
    env (`suggested`: its suggested_context), so `auto` resumes a run given the name it
    resolves to; `resolved_parser` is what this launch's --parser resolved to."""

    def context(value: Any) -> tuple[str, str]:
        kind = context_of(replace(cfg, context=value), suggested)
        return kind, kind

    def parser(value: Any) -> tuple[str, str]:
        try:
            found = (
                resolved_parser
                if value == cfg.parser
                else _parser_of(value, env_factory, env_kwargs)
            )
        except ValueError:  # a module:function that no longer imports: compared as typed
            return f"unresolved {value!r}", str(value)
        return parser_identity(found), parser_name(found)

    return {"--context": context, "--parser": parser}


def _parser_of(spec: Any, env_factory: Callable[..., Any], env_kwargs: dict[str, Any]) -> Parser:
    if not isinstance(spec, str):
        raise ValueError(f"--parser {spec!r} is not a parser name")
    from ludic.eval.env_spec import declared_parser, resolve_parser

    if spec == "auto":
        return declared_parser(env_factory, env_kwargs) or identity_parser
    return resolve_parser(spec)

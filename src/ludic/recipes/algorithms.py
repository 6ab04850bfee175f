"""The one registry of algorithm presets the commands offer, and GiGPO's knobs as CLI options.

`ludic train`, `ludic actor` and `ludic learner` all pick their preset with `make_algorithm`
from `PRESETS`, so a preset added here is selectable everywhere; `ludic eval --credit gigpo`
uses the same `GiGPOOptions`. Importing this module is light (no torch): the presets in
`ludic.training.algorithm` load when `make_algorithm` runs. It offers only the presets'
CLI-relevant knobs; for anything else build `RLAlgorithm` in Python. Offline presets (`sft`,
and `awr` on a JSONL) are `ludic sft`'s.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

if TYPE_CHECKING:
    from ludic.training.algorithm_types import RLAlgorithm
    from ludic.training.credit import GiGPO

Algorithm = Literal[
    "grpo",
    "dr_grpo",
    "gspo",
    "cispo",
    "gmpo",
    "gigpo",
    "reinforce",
    "reinforce_baseline",
    "rloo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "awr",
]
"""Every online preset by name (`--algorithm`)."""

STATE_KEYS = ("env", "observation")
_GIGPO_CHECK = re.compile(r"^GiGPO: (with combine='seed003' )?(\w+) (.*)$", re.DOTALL)


@dataclass(frozen=True, kw_only=True, slots=True)
class GiGPOOptions:
    """GiGPO's knobs (arXiv:2505.10978 and seed 003); used only with --algorithm gigpo."""

    omega: float | None = None
    """Weight of the step-level (anchor-state) advantage A_S: A = A_E + omega * A_S with
    combine=paper (default 1.0), or omega * A_E + (1 - omega) * A_S with combine=seed003
    (default 0.5)."""
    combine: Literal["paper", "seed003"] = "paper"
    """How A_E and A_S combine: paper (A_E + omega A_S) or seed003 (a convex mix)."""
    gamma: float = 0.95
    """Discount of the step-level returns-to-go compared among turns from the same state."""
    default_step_reward: float = 0.0
    """Added to every turn's reward before the returns-to-go (e.g. -0.01, a time penalty
    for sparse rewards)."""
    episode_stat: Literal["trajectory", "step_rows"] = "trajectory"
    """Over what A_E's mean and std run: trajectory (one value per episode, the paper's
    equation) or step_rows (one per turn, as verl-agent computes it)."""
    state_key: str = "env"
    """What makes two turns the same anchor state: env (the env's `state_key`, else a hash of
    the observation text), observation (always the observation text's hash), or a
    `module:function` taking a `ludic.types.Turn` and returning a hashable key or None."""
    normalize_std: bool = True
    """Divide A_E by its group's std (off: mean-centred only, the reference's mean_norm)."""
    step_normalize_std: bool = True
    """Divide A_S by its anchor group's std (off: mean-centred only)."""

    def __post_init__(self) -> None:
        if self.state_key not in STATE_KEYS and ":" not in self.state_key:
            raise ValueError(
                f"--gigpo.state-key {self.state_key!r}: use env, observation or a "
                "'module:function' taking a Turn and returning a hashable key"
            )

    def credit(self) -> GiGPO:
        """The `GiGPO` credit assigner with these knobs."""
        from ludic.training.credit import GiGPO

        anchor_key = self.anchor_key()
        try:
            return GiGPO(anchor_key=anchor_key, **self._credit_kwargs())
        except ValueError as e:
            raise self.flag_error(e) from e

    def flag_error(self, error: ValueError) -> ValueError:
        """`GiGPO`'s check `error` ("GiGPO: gamma must be in [0, 1], got 2.0") naming the
        flag that set the knob ("--gigpo.gamma 2.0: must be in [0, 1], got 2.0"); an error
        about no knob of these options is returned as is."""
        found = _GIGPO_CHECK.match(str(error))
        if found is None or found[2] not in self._credit_kwargs():
            return error
        knob = found[2]
        when = " with --gigpo.combine seed003" if found[1] else ""
        flag = "--gigpo." + knob.replace("_", "-")
        return ValueError(f"{flag} {getattr(self, knob)}{when}: {found[3]}")

    def anchor_key(self) -> Callable[[Any], Any]:
        """The function giving a turn's anchor state (see `state_key`)."""
        if self.state_key == "env":
            from ludic.training.credit import default_anchor_key  # torch: only when used

            return default_anchor_key
        if self.state_key == "observation":
            return observation_anchor_key
        from ludic.eval.env_spec import import_object

        try:
            fn = import_object(self.state_key)
        except ValueError as e:  # name the flag: the bare message names only the module
            raise ValueError(
                f"--gigpo.state-key {self.state_key}: {e}; it takes env, observation or a "
                "'module:function' taking a Turn and returning a hashable key"
            ) from e
        if not callable(fn):
            raise ValueError(f"--gigpo.state-key {self.state_key!r} is not callable")
        _check_one_argument(fn, self.state_key)
        return fn  # type: ignore[no-any-return]

    def _credit_kwargs(self) -> dict[str, Any]:
        return {
            "gamma": self.gamma,
            "omega": self.omega,
            "combine": self.combine,
            "normalize_std": self.normalize_std,
            "step_normalize_std": self.step_normalize_std,
            "default_step_reward": self.default_step_reward,
            "episode_stat": self.episode_stat,
        }


def _check_one_argument(fn: Callable[..., Any], spec: str) -> None:
    """Refuse a --gigpo.state-key callable that cannot be called with one turn, now rather
    than as a bare TypeError after the first batch is generated."""
    import inspect

    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: cannot tell, let it run
        return
    try:
        signature.bind(object())
    except TypeError as e:
        raise ValueError(
            f"--gigpo.state-key {spec}: {getattr(fn, '__name__', spec)}{signature} cannot be "
            f"called with one turn ({e}); it must be `def state_key(turn: ludic.types.Turn) -> "
            "Hashable | None` (one positional argument, returning the turn's anchor state or "
            "None)"
        ) from e


def observation_anchor_key(turn: Any) -> Any:
    """A turn's anchor state from its observation text only (ignores the env's state key)."""
    import hashlib

    if not turn.agent_steps:
        return None
    return ("observation", hashlib.sha256(turn.observation.encode("utf-8")).hexdigest())


@dataclass(frozen=True, kw_only=True, slots=True)
class PresetInputs:
    """What a preset may need from the command: the generation budget (Dr.GRPO's constant
    normaliser) and GiGPO's knobs."""

    max_tokens: int | None = None
    gigpo: GiGPOOptions = field(default_factory=GiGPOOptions)


def _gigpo(inputs: PresetInputs) -> RLAlgorithm:
    from ludic.training.algorithm import make_gigpo

    anchor_key = inputs.gigpo.anchor_key()
    try:
        return make_gigpo(anchor_key=anchor_key, **inputs.gigpo._credit_kwargs())
    except ValueError as e:
        raise inputs.gigpo.flag_error(e) from e


def _dr_grpo(inputs: PresetInputs) -> RLAlgorithm:
    from ludic.training.algorithm import make_dr_grpo

    if inputs.max_tokens is None:
        raise ValueError("dr_grpo normalises by the generation budget: pass --max-tokens")
    return make_dr_grpo(max_tokens=inputs.max_tokens)


def _plain(factory: str, **kwargs: Any) -> Callable[[PresetInputs], RLAlgorithm]:
    def make(inputs: PresetInputs) -> RLAlgorithm:
        from ludic.training import algorithm

        return getattr(algorithm, factory)(**kwargs)  # type: ignore[no-any-return]

    return make


PRESETS: dict[str, Callable[[PresetInputs], RLAlgorithm]] = {
    "grpo": _plain("make_grpo"),
    "dr_grpo": _dr_grpo,
    "gspo": _plain("make_gspo"),
    "cispo": _plain("make_cispo"),
    "gmpo": _plain("make_gmpo"),
    "gigpo": _gigpo,
    "reinforce": _plain("make_reinforce"),
    "reinforce_baseline": _plain("make_reinforce_baseline"),
    "rloo": _plain("make_rloo"),
    "reinforce_pp": _plain("make_reinforce_pp"),
    "reinforce_pp_baseline": _plain("make_reinforce_pp", group_baseline=True),
    "awr": _plain("make_awr"),
}
"""Every online preset by name: the single list `--algorithm` offers in every command."""

if set(PRESETS) != set(get_args(Algorithm)):  # pragma: no cover - caught at import
    raise AssertionError("PRESETS and Algorithm must name the same presets")


SPLIT_OVER_TURNS_PRESETS = ("grpo", "dr_grpo", "gspo", "cispo", "gmpo", "reinforce_baseline")
"""The presets whose credit is `GroupNormalizedReturn`, which `--split-over-turns` configures."""


def make_algorithm(
    name: str,
    *,
    max_tokens: int | None = None,
    gigpo: GiGPOOptions | None = None,
    split_over_turns: bool = False,
) -> RLAlgorithm:
    """The preset `name` (see `PRESETS`). GiGPO options other than the defaults are refused
    for any other preset, so a knob is never silently ignored; so is `split_over_turns` (each
    turn of a k-turn episode gets A / k) outside `SPLIT_OVER_TURNS_PRESETS`."""
    gigpo = gigpo or GiGPOOptions()
    check_gigpo_options(name, gigpo)
    check_split_over_turns(name, split_over_turns)
    algorithm = PRESETS[name](PresetInputs(max_tokens=max_tokens, gigpo=gigpo))
    if not split_over_turns:
        return algorithm
    import dataclasses

    credit = dataclasses.replace(algorithm.credit_assigner, split_over_turns=True)  # type: ignore[type-var]
    return dataclasses.replace(algorithm, credit_assigner=credit)


def check_split_over_turns(name: str, split_over_turns: bool) -> None:
    """Refuse `--split-over-turns` with a preset whose credit is not GRPO's group-normalised
    episode return (it would be ignored). Imports no torch."""
    if split_over_turns and name not in SPLIT_OVER_TURNS_PRESETS:
        raise ValueError(
            f"--split-over-turns applies to the group-normalised presets "
            f"({', '.join(SPLIT_OVER_TURNS_PRESETS)}), not {name!r}: drop it or pick one of them"
        )


def check_gigpo_options(name: str, gigpo: GiGPOOptions) -> None:
    """Refuse an unknown preset `name`, and GiGPO options other than the defaults with any
    preset but gigpo (they would be ignored). Imports no torch, so a command can run it
    before any slow work (`ludic actor` before Redis and the model)."""
    if name not in PRESETS:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {sorted(PRESETS)}")
    if name != "gigpo" and gigpo != GiGPOOptions():
        raise ValueError(
            f"--gigpo.* options apply only to --algorithm gigpo, not {name!r}: drop them or "
            "pass --algorithm gigpo"
        )


__all__ = [
    "PRESETS",
    "SPLIT_OVER_TURNS_PRESETS",
    "STATE_KEYS",
    "Algorithm",
    "GiGPOOptions",
    "PresetInputs",
    "check_gigpo_options",
    "check_split_over_turns",
    "make_algorithm",
    "observation_anchor_key",
]

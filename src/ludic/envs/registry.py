"""The built-in env registry: names to factories, for `RolloutEngine(env_registry=...)` and
the `ludic` CLI (`--env tictactoe --env-kwargs '{"opponent": "random"}'`).

Each entry is an `EnvSpec`: callable like a factory, and carrying the parser that matches the
env's action format (`spec.parser`), which the CLI's `--parser auto` picks up. It deliberately
holds no protocol or agent choices.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ludic.envs.base import LudicEnv
from ludic.envs.code_env import code_test_env
from ludic.envs.dataset_qa import DatasetQAEnv
from ludic.envs.guess_number import GuessNumberEnv
from ludic.envs.key_door import KeyDoorGridEnv
from ludic.envs.long_task import MemoryCorridorEnv
from ludic.envs.qa_data import load_jsonl_dataset, load_math_sample
from ludic.envs.tictactoe import TicTacToeEnv
from ludic.envs.tictactoe_duel import TicTacToeDuelEnv
from ludic.envs.verifiers import exact_match, numeric_match
from ludic.parsers import Parser, boxed_parser, xml_tag_parser

MATH_SYSTEM_PROMPT = (
    "Solve the math problem step by step, then give the final answer as a number in "
    "\\boxed{}, for example \\boxed{42}."
)


@dataclass(frozen=True, kw_only=True, slots=True)
class EnvSpec:
    """A named env factory with the parser its action format needs (None: the raw text)."""

    name: str
    factory: Callable[..., LudicEnv]
    parser: Parser | None
    description: str

    def __call__(self, **kwargs: Any) -> LudicEnv:
        return self.factory(**kwargs)


def math_qa_env(
    *,
    path: str | None = None,
    limit: int | None = None,
    verifier: Literal["numeric", "exact"] = "numeric",
    sample_index: int | None = None,
    parse_failure_ends_episode: bool = True,
) -> DatasetQAEnv:
    """DatasetQAEnv over the bundled math sample, or a local GSM8K-style JSONL at `path`.
    One question, one answer: a reply without a `\\boxed{}` answer ends the episode as a
    parse failure; `parse_failure_ends_episode=False` (`--env-kwargs
    '{"parse_failure_ends_episode": false}'`) allows format retries up to `--max-steps`."""
    if verifier not in ("numeric", "exact"):
        raise ValueError(f"verifier must be 'numeric' or 'exact', got {verifier!r}")
    dataset = load_math_sample() if path is None else load_jsonl_dataset(path)
    return DatasetQAEnv(
        dataset[:limit] if limit is not None else dataset,
        verifier=numeric_match if verifier == "numeric" else exact_match,
        system_prompt=MATH_SYSTEM_PROMPT,
        sample_index=sample_index,
        parse_failure_ends_episode=parse_failure_ends_episode,
    )


def _spec(name: str, factory: Callable[..., LudicEnv], parser: Parser | None, text: str) -> EnvSpec:
    return EnvSpec(name=name, factory=factory, parser=parser, description=text)


_MOVE = xml_tag_parser("move")
BUILTIN_ENVS: dict[str, Callable[..., LudicEnv]] = {
    "tictactoe": _spec("tictactoe", TicTacToeEnv, _MOVE, "tic-tac-toe vs a scripted opponent"),
    "tictactoe_duel": _spec(
        "tictactoe_duel", TicTacToeDuelEnv, _MOVE, "two-agent tic-tac-toe (seats X and O)"
    ),
    "key_door": _spec(
        "key_door", KeyDoorGridEnv, _MOVE, "grid world: fetch the key, open the door"
    ),
    "guess_number": _spec("guess_number", GuessNumberEnv, _MOVE, "guess 1..N from higher/lower"),
    "math_qa": _spec("math_qa", math_qa_env, boxed_parser(), "one-shot math word problems"),
    "code": _spec(
        "code", code_test_env, None, "APPS-style programs run against stdin/stdout tests"
    ),
    "memory_corridor": _spec(
        "memory_corridor", MemoryCorridorEnv, None, "long corridor that overflows the context"
    ),
}


# `--env PREFIX:TARGET` for another ecosystem's env: prefix -> the adapter module, whose
# `env_spec(TARGET)` builds the EnvSpec (importing the ecosystem's package only then).
ADAPTER_PREFIXES: dict[str, str] = {
    "gymnasium": "ludic.envs.adapters.gymnasium",
    "textarena": "ludic.envs.adapters.textarena",
    "reasoning_gym": "ludic.envs.adapters.reasoning_gym",
    "openenv": "ludic.envs.adapters.openenv",
    "verifiers": "ludic.envs.adapters.verifiers",
}
# Prefixes users will try that have no adapter yet, with the reason (not a confusing import
# error from the `module:factory` fallback).
UNSUPPORTED_PREFIXES: dict[str, str] = {}


def adapter_spec(name: str) -> EnvSpec | None:
    """The EnvSpec of an ecosystem env named `PREFIX:TARGET` (`gymnasium:FrozenLake-v1`,
    `textarena:TicTacToe-v0`, `reasoning_gym:countdown`, `openenv:URL`, `openenv:module:Class`,
    `verifiers:TASKSET`),
    or None when `name` has no adapter prefix (a built-in name or a `module:factory` string).

    Raises ImportError with the `pip install 'ludic[EXTRA]'` line when the package is missing.
    """
    prefix, sep, target = name.partition(":")
    if sep and prefix in UNSUPPORTED_PREFIXES:
        raise ValueError(f"--env {name}: {UNSUPPORTED_PREFIXES[prefix]}")
    if not sep or prefix not in ADAPTER_PREFIXES:
        return None
    if not target:
        raise ValueError(f"{name!r} names no env after {prefix + ':'!r}; e.g. {_EXAMPLES[prefix]}")
    module = importlib.import_module(ADAPTER_PREFIXES[prefix])
    spec: EnvSpec = module.env_spec(target)
    return spec


_EXAMPLES = {
    "gymnasium": "gymnasium:FrozenLake-v1",
    "textarena": "textarena:TicTacToe-v0",
    "reasoning_gym": "reasoning_gym:countdown",
    "openenv": "openenv:http://localhost:8000",
    "verifiers": "verifiers:my_taskset",
}


def _check_name(name: object, function: str) -> None:
    """Refuse a `name` that is not a string (None, an env class) naming what to pass."""
    if not isinstance(name, str):
        raise TypeError(
            f"{function} takes an env's name as a str: a built-in env (one of "
            f"{sorted(BUILTIN_ENVS)}) or 'PREFIX:TARGET' (e.g. 'gymnasium:FrozenLake-v1'), "
            f"got {name!r} ({type(name).__name__})"
        )


def make_env(name: str, **kwargs: Any) -> LudicEnv:
    """Build the built-in (or `PREFIX:TARGET` ecosystem) env `name` with `kwargs`; KeyError
    listing the names if unknown, TypeError if `name` is not a str."""
    _check_name(name, "make_env")
    if (spec := adapter_spec(name)) is not None:
        return spec(**kwargs)
    if name not in BUILTIN_ENVS:
        raise KeyError(f"no built-in env {name!r}; choose one of {sorted(BUILTIN_ENVS)}")
    return BUILTIN_ENVS[name](**kwargs)


def env_parser(name: str) -> Parser | None:
    """The parser suggested for built-in env `name` (None: use the completion as the action);
    KeyError listing the names if unknown, TypeError if `name` is not a str."""
    _check_name(name, "env_parser")
    if (spec := adapter_spec(name)) is not None:
        return spec.parser
    if name not in BUILTIN_ENVS:
        raise KeyError(f"no built-in env {name!r}; choose one of {sorted(BUILTIN_ENVS)}")
    parser: Parser | None = getattr(BUILTIN_ENVS[name], "parser", None)
    return parser

"""The envs' own answer parsing (verifiers, GSM8K answers, code fences, game moves) is linear:
1 MiB of hostile action text is handled in well under a second, with the right result.

The bound is generous (3 s on a loaded 2-core box, where each takes ~0.1 s); a quadratic scan
of 1 MiB would take hours.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from ludic.envs.code_env import compile_error, extract_code, outputs_match
from ludic.envs.dataset_qa import DatasetQAEnv, final_answer
from ludic.envs.guess_number import GuessNumberEnv
from ludic.envs.key_door import KeyDoorGridEnv
from ludic.envs.long_task import MemoryCorridorEnv
from ludic.envs.tictactoe import parse_cell
from ludic.envs.verifiers import exact_match, normalize_answer, numeric_match, parse_number

MIB = 1 << 20
# CPU seconds of the parsing thread, not wall time (which on a loaded CI box also counts the
# wait for a core): a quadratic parse takes minutes of CPU at 1 MiB.
LINEAR_BOUND_S = 3.0


def one_mib(unit: str, tail: str = "") -> str:
    return unit * ((MIB - len(tail)) // len(unit)) + tail


def env_step(env_type: type, action: str) -> object:
    env = env_type()
    env.env_reset(seed=0)
    return env.env_step(action)


def qa_step(action: str) -> object:
    env = DatasetQAEnv([{"question": "q", "answer": "#### 42"}], verifier=numeric_match)
    env.env_reset(seed=0)
    return env.env_step(action)


HOSTILE: list[tuple[str, Callable[[str], object], str]] = [
    ("parse_number text wrappers", parse_number, one_mib("\\text{")),
    ("parse_number digits", parse_number, one_mib("1", "x")),
    ("parse_number fractions", parse_number, one_mib("\\frac{1}{")),
    ("parse_number decorations", parse_number, one_mib("$,%\\!")),
    ("numeric_match", lambda text: numeric_match(text, "42"), one_mib("4", ".")),
    ("exact_match", lambda text: exact_match(text, "42"), one_mib(" .\n")),
    ("normalize_answer", normalize_answer, one_mib(" \t")),
    ("final_answer", final_answer, one_mib("####")),
    ("extract_code fences", extract_code, one_mib("```\n")),
    ("extract_code tags", extract_code, one_mib("```python")),
    ("extract_code open", extract_code, "```python\n" + one_mib("`` ")),
    ("compile_error", compile_error, one_mib("(")),
    ("outputs_match", lambda text: outputs_match(text, "1"), one_mib(" \n")),
    ("parse_cell", parse_cell, one_mib(" ", "5")),
    ("guess number", lambda a: env_step(GuessNumberEnv, a), one_mib("1")),
    ("key door", lambda a: env_step(KeyDoorGridEnv, a), one_mib(" ")),
    ("memory corridor", lambda a: env_step(MemoryCorridorEnv, a), "answer" + one_mib(" ", "x y")),
    ("dataset qa", qa_step, one_mib("4")),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("name", "parse", "text"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_env_answer_parsing_is_linear(name: str, parse: Callable[[str], object], text: str) -> None:
    started = time.thread_time()
    parse(text)
    elapsed = time.thread_time() - started
    assert elapsed < LINEAR_BOUND_S, f"{name}: {elapsed:.1f} CPU s for 1 MiB (quadratic?)"


def test_hostile_answers_still_score_right() -> None:
    assert parse_number(one_mib("1", "x")) is None
    assert numeric_match(one_mib(" ", "42"), "42")
    assert final_answer(one_mib("x", "#### 7")) == "7"
    assert extract_code(one_mib("```\nx\n```\n", "```python\nprint(1)\n```")) == "print(1)\n"
    assert parse_cell(one_mib(" ", "5")) == 5

"""CodeTestEnv: APPS-style programming problems. The model writes a program; it runs against
stdin/stdout test cases in a `ludic.sandbox` sandbox; the reward is the fraction of tests
passed (or all-or-nothing), with a penalty for code that does not compile. `info["success"]`
says whether every test passed (what `ludic eval` counts as solved, whatever the scoring).

One step per episode: a reply that fails to parse (e.g. cut off at the token limit under
`--reject-incomplete`) ends it as a recorded parse failure (`parse_failure_ends_episode`),
unless `parse_failure_ends_episode=False` allows retries. It deliberately compiles the code on the host only to check syntax
(`compile()` executes nothing); the code itself runs only in the sandbox. It does not
download datasets: bring your own problems as `CodeProblem`s or a JSONL file.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from ludic.envs.arg_types import checked_arguments
from ludic.envs.base import set_parse_failure_ends_episode
from ludic.envs.qa_data import load_jsonl_dataset
from ludic.envs.single_agent import SingleAgentEnv
from ludic.sandbox import SandboxLimits, SandboxPool, SandboxResult, shared_pool
from ludic.types import Info, StepOutcome

Scoring = Literal["fraction", "all_or_nothing"]
CODE_PROBLEMS = "code_problems.jsonl"
CODE_LIMITS = SandboxLimits(wall_time_s=10.0, cpu_time_s=4, max_output_bytes=256 * 1024)
SYSTEM_PROMPT = (
    "You are an expert Python programmer. Solve the problem with a complete Python 3 program "
    "that reads standard input and writes standard output. Reply with the program in one "
    "```python code block."
)
_FENCE = re.compile(r"```([\w+-]*)[ \t]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"python", "python3", "py"}
_SNIPPET_CHARS = 300


@dataclass(frozen=True, kw_only=True, slots=True)
class CodeTest:
    """One test case: the program reads `input` and must print `output`."""

    input: str
    output: str


@dataclass(frozen=True, kw_only=True, slots=True)
class CodeProblem:
    """A problem statement with its test cases (and optionally a reference solution)."""

    id: str
    prompt: str
    tests: tuple[CodeTest, ...]
    solution: str | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CodeProblem:
        missing = [k for k in ("id", "prompt", "tests") if k not in d]
        if missing:
            raise ValueError(f"code problem {d.get('id', '?')!r} lacks {missing}")
        if not d["tests"]:
            raise ValueError(f"code problem {d['id']!r} has no tests; give at least one")
        tests = tuple(CodeTest(input=t["input"], output=t["output"]) for t in d["tests"])
        return cls(id=str(d["id"]), prompt=d["prompt"], tests=tests, solution=d.get("solution"))


def load_code_problems(path: str | Path | None = None) -> list[CodeProblem]:
    """Problems from a JSONL file (`{"id", "prompt", "tests": [{"input", "output"}],
    "solution"?}` per line); without a path, the 10 small problems bundled with Ludic."""
    if path is not None:
        records = load_jsonl_dataset(path)
    else:
        bundled = resources.files("ludic.envs").joinpath("data").joinpath(CODE_PROBLEMS)
        with resources.as_file(bundled) as file:
            records = load_jsonl_dataset(file)
    return [CodeProblem.from_dict(r) for r in records]


def extract_code(text: str) -> str:
    """The last ```python fenced block (else the last fenced block, else the whole text)."""
    blocks = _FENCE.findall(text)
    python_blocks = [body for tag, body in blocks if tag.lower() in _PYTHON_TAGS]
    if python_blocks:
        return python_blocks[-1]
    if blocks:
        return blocks[-1][1]
    return text


def outputs_match(actual: str, expected: str) -> bool:
    """Equal up to trailing whitespace on each line and blank lines at either end."""

    def norm(text: str) -> list[str]:
        return [line.rstrip() for line in text.strip().splitlines()]

    return norm(actual) == norm(expected)


def compile_error(code: str) -> str | None:
    """Why `code` is not a Python program (None when it compiles). Executes nothing."""
    if not code.strip():
        return "no code found"
    try:
        compile(code, "main.py", "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"{type(exc).__name__}: {exc.msg} (line {exc.lineno})"
    except (ValueError, RecursionError, MemoryError, OverflowError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _test_info(index: int, test: CodeTest, result: SandboxResult) -> Info:
    return {
        "index": index,
        "passed": result.ok and outputs_match(result.stdout, test.output),
        "exit_code": result.exit_code,
        "limit_hit": result.limit_hit,
        "timed_out": result.timed_out,
        "memory_exceeded": result.memory_exceeded,
        "output_truncated": result.output_truncated,
        "killed_signal": result.killed_signal,
        "duration_s": round(result.duration_s, 4),
        "cached": result.cached,
        "stdout_head": result.stdout[:_SNIPPET_CHARS],
        "stderr_tail": result.stderr[-_SNIPPET_CHARS:],
    }


class CodeTestEnv(SingleAgentEnv):
    """One problem per episode, chosen by the reset seed (`seed % len(problems)`).

    Reward: the fraction of tests passed (`scoring="fraction"`) or 1/0 (`"all_or_nothing"`);
    code that does not compile (or no code) gets `-compile_penalty` and is not run.
    `info["tests"]` holds one record per test. Without a `pool`, envs share the event loop's
    `shared_pool()` (one cache, one sandbox per CPU at a time).

    Limits: an explicit `limits` wins; otherwise each test runs under the given `pool`'s own
    limits, or `CODE_LIMITS` on the shared pool.
    """

    parse_failure_ends_episode = True  # one answer per episode (see __init__)

    system_prompt = SYSTEM_PROMPT

    @checked_arguments
    def __init__(
        self,
        problems: Sequence[CodeProblem] | None = None,
        *,
        pool: SandboxPool | None = None,
        scoring: Scoring = "fraction",
        compile_penalty: float = 0.5,
        limits: SandboxLimits | None = None,
        parse_failure_ends_episode: bool | None = None,
    ) -> None:
        set_parse_failure_ends_episode(self, parse_failure_ends_episode)
        if scoring not in ("fraction", "all_or_nothing"):
            raise ValueError(f"scoring must be 'fraction' or 'all_or_nothing', got {scoring!r}")
        if not (isinstance(compile_penalty, int | float) and 0 <= compile_penalty < math.inf):
            raise ValueError(
                f"compile_penalty must be a finite number >= 0 (code that does not compile gets "
                f"reward -compile_penalty), got {compile_penalty!r}; pass 0.5 for a reward of "
                "-0.5, not -0.5, which would reward code that does not compile"
            )
        self.problems = list(problems) if problems is not None else load_code_problems()
        if not self.problems:
            raise ValueError("CodeTestEnv needs at least one problem")
        self.pool = pool
        self.scoring = scoring
        self.compile_penalty = compile_penalty
        self.limits = limits
        self.problem: CodeProblem | None = None

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        index = (
            seed % len(self.problems) if seed is not None else random.randrange(len(self.problems))
        )
        self.problem = self.problems[index]
        info: Info = {"problem_id": self.problem.id, "num_tests": len(self.problem.tests)}
        return self.problem.prompt, info

    async def env_step(self, action: str) -> StepOutcome:
        if self.problem is None:
            raise RuntimeError("CodeTestEnv.env_step before env_reset; reset the env first")
        problem = self.problem
        code = extract_code(action)
        error = compile_error(code)
        info: Info = {"problem_id": problem.id, "compiled": error is None, "compile_error": error}
        if error is not None:
            info.update(passed=0, total=len(problem.tests), tests=[], success=False)
            obs = f"Your code does not compile: {error}"
            return StepOutcome(obs=obs, reward=-self.compile_penalty, terminated=True, info=info)
        pool = self.pool or shared_pool()
        limits = self.run_limits()
        results = await asyncio.gather(
            *(pool.run_python(code, stdin=t.input, limits=limits) for t in problem.tests)
        )
        tests = [
            _test_info(i, t, r) for i, (t, r) in enumerate(zip(problem.tests, results, strict=True))
        ]
        passed = sum(t["passed"] for t in tests)
        total = len(tests)
        if self.scoring == "fraction":
            reward = passed / total
        else:
            reward = float(passed == total)
        info.update(passed=passed, total=total, tests=tests, isolation=results[0].isolation)
        info["success"] = passed == total  # solved: every test, whatever the scoring
        obs = f"Passed {passed}/{total} tests."
        return StepOutcome(obs=obs, reward=reward, terminated=True, info=info)

    def run_limits(self) -> SandboxLimits:
        """The limits each test runs under: `limits` if given, else the pool's, else
        `CODE_LIMITS` (the shared pool's defaults are not tuned for test cases)."""
        if self.limits is not None:
            return self.limits
        return self.pool.limits if self.pool is not None else CODE_LIMITS

    def env_state_key(self) -> Hashable | None:
        return None if self.problem is None else self.problem.id


def code_test_env(
    *,
    path: str | None = None,
    limit: int | None = None,
    scoring: Scoring = "fraction",
    compile_penalty: float = 0.5,
    parse_failure_ends_episode: bool = True,
) -> CodeTestEnv:
    """CodeTestEnv from JSON-friendly arguments (for registries and the CLI): the bundled
    problems, or a local JSONL at `path`; the first `limit` problems if given."""
    problems = load_code_problems(path)
    return CodeTestEnv(
        problems[:limit] if limit is not None else problems,
        scoring=scoring,
        compile_penalty=compile_penalty,
        parse_failure_ends_episode=parse_failure_ends_episode,
    )

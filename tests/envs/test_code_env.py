"""CodeTestEnv: bundled problems, code extraction, scoring of correct / wrong / non-compiling
solutions, attacks recorded in step info, and a whole episode through the protocol."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from ludic.agents import Agent
from ludic.envs.code_env import (
    CodeProblem,
    CodeTest,
    CodeTestEnv,
    code_test_env,
    compile_error,
    extract_code,
    load_code_problems,
    outputs_match,
)
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.sandbox import SandboxLimits, SandboxPool, shared_pool

SUM_TWO = "a, b = map(int, input().split())\nprint(a + b)\n"
FAST = SandboxLimits(
    wall_time_s=1.5, cpu_time_s=10, memory_bytes=128 * 2**20, max_output_bytes=4096
)
ECHO = CodeProblem(
    id="echo", prompt="Echo the line.", tests=(CodeTest(input="hi\n", output="hi\n"),)
)


def env_for(problem_id: str, **kwargs: object) -> CodeTestEnv:
    problems = load_code_problems()
    env = CodeTestEnv(problems, **kwargs)  # type: ignore[arg-type]
    env.env_reset(seed=[p.id for p in problems].index(problem_id))
    return env


def test_bundled_problems_load() -> None:
    problems = load_code_problems()
    assert len(problems) == 10 and len({p.id for p in problems}) == 10
    assert all(p.tests and p.solution and p.prompt for p in problems)


def test_problems_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"id": "x", "prompt": "p", "tests": [{"input": "", "output": "1"}]}))
    (problem,) = load_code_problems(path)
    assert problem.tests == (CodeTest(input="", output="1"),) and problem.solution is None
    path.write_text(json.dumps({"id": "x", "prompt": "p", "tests": []}))
    with pytest.raises(ValueError, match="no tests"):
        load_code_problems(path)


def test_extract_code_prefers_the_last_python_block() -> None:
    text = "Idea:\n```\nnot this\n```\nFirst try:\n```python\nprint(1)\n```\nBetter:\n```py\nprint(2)\n```\n"
    assert extract_code(text) == "print(2)\n"
    assert extract_code("```\nprint(3)\n```") == "print(3)\n"
    assert extract_code("print(4)") == "print(4)"


def test_outputs_match_ignores_trailing_whitespace_only() -> None:
    assert outputs_match("1 2  \n3\n\n", "1 2\n3")
    assert not outputs_match("1  2\n", "1 2\n")
    assert not outputs_match("12\n", "1\n2\n")


def test_compile_error() -> None:
    assert compile_error(SUM_TWO) is None
    assert compile_error("def f(:\n") is not None and "SyntaxError" in str(compile_error("def f(:"))
    assert compile_error("return 1") is not None  # caught by the compiler, not the parser
    assert compile_error("  \n") == "no code found"
    assert compile_error("x = 1\0") is not None


def test_seed_picks_the_problem_and_state_key() -> None:
    env = CodeTestEnv()
    obs, info = env.env_reset(seed=13)
    assert env.problem is env.problems[3] and obs == env.problems[3].prompt
    assert info == {"problem_id": env.problems[3].id, "num_tests": len(env.problems[3].tests)}
    assert env.env_state_key() == env.problems[3].id


async def test_correct_solution_scores_one() -> None:
    env = env_for("sum_two")
    outcome = await env.env_step(f"Here you go:\n```python\n{SUM_TWO}```")
    assert outcome.terminated and outcome.reward == 1.0
    info = outcome.info
    assert info["compiled"] and info["passed"] == info["total"] == 4
    assert [t["passed"] for t in info["tests"]] == [True] * 4
    assert info["isolation"] in ("bubblewrap", "subprocess")
    assert env.pool is None and shared_pool().misses == 4  # the loop's shared pool ran them
    json.dumps(info)  # step info must be JSON-safe


async def test_every_bundled_reference_solution_passes() -> None:
    pool = SandboxPool(max_concurrency=4)
    env = CodeTestEnv(pool=pool)
    for seed, problem in enumerate(env.problems):
        env.env_reset(seed=seed)
        outcome = await env.env_step(f"```python\n{problem.solution}```")
        assert outcome.reward == 1.0, (problem.id, outcome.info["tests"])


@pytest.mark.parametrize("scoring,reward", [("fraction", 0.75), ("all_or_nothing", 0.0)])
async def test_wrong_solution_scores_by_tests_passed(scoring: str, reward: float) -> None:
    env = env_for("sum_two", scoring=scoring)
    outcome = await env.env_step(
        "```python\na, b = map(int, input().split())\nprint(abs(a + b))\n```"
    )
    assert outcome.reward == reward and outcome.terminated
    assert [t["passed"] for t in outcome.info["tests"]] == [True, True, True, False]
    assert outcome.info["tests"][3]["stdout_head"] == "7\n"


async def test_non_compiling_code_is_penalised_and_not_run() -> None:
    pool = SandboxPool()
    env = env_for("sum_two", pool=pool, compile_penalty=0.25)
    outcome = await env.env_step("```python\nprint(1 +\n```")
    assert outcome.reward == -0.25 and outcome.terminated
    assert outcome.info["compiled"] is False and "SyntaxError" in outcome.info["compile_error"]
    assert outcome.info["tests"] == [] and pool.misses == 0


async def test_a_crashing_solution_fails_its_tests() -> None:
    env = env_for("sum_two")
    outcome = await env.env_step("```python\nraise SystemExit(3)\n```")
    assert outcome.reward == 0.0
    assert {t["exit_code"] for t in outcome.info["tests"]} == {3}


async def test_step_before_reset_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="reset"):
        await CodeTestEnv().env_step("print(1)")


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="scoring"):
        CodeTestEnv(scoring="partial")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one"):
        CodeTestEnv([])


ATTACKS = {
    "infinite_loop": ("while True:\n    pass\n", "wall_time"),
    "fork_bomb": (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        "wall_time",
    ),
    "memory_bomb": ("blocks = []\nwhile True:\n    blocks.append(bytearray(1 << 23))\n", "memory"),
    "print_gigabytes": ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", "output"),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
async def test_attacks_are_recorded_in_step_info(attack: str) -> None:
    code, limit = ATTACKS[attack]
    env = CodeTestEnv([ECHO], limits=FAST)
    env.env_reset(seed=0)
    outcome = await env.env_step(f"```python\n{code}```")
    (test,) = outcome.info["tests"]
    assert outcome.reward == 0.0 and outcome.terminated
    assert test["limit_hit"] == limit and test["passed"] is False


async def test_secrets_and_host_files_stay_out_of_the_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = f"s3cret-{uuid.uuid4().hex}"
    monkeypatch.setenv("LUDIC_TEST_SECRET", secret)
    host_file = tmp_path / "secret.txt"
    host_file.write_text(secret)
    target = tmp_path / "escaped.txt"
    code = (
        "import os, socket\n"
        "print(os.environ.get('LUDIC_TEST_SECRET'))\n"
        f"for action in (lambda: open({str(host_file)!r}).read(),\n"
        f"               lambda: open({str(target)!r}, 'w').write('x'),\n"
        "               lambda: socket.create_connection(('127.0.0.1', 9), timeout=2)):\n"
        "    try:\n        print(action())\n    except OSError as e:\n        print('denied')\n"
    )
    env = CodeTestEnv([ECHO], limits=FAST)
    env.env_reset(seed=0)
    outcome = await env.env_step(f"```python\n{code}```")
    (test,) = outcome.info["tests"]
    assert test["stdout_head"] == "None\ndenied\ndenied\ndenied\n", test
    assert not target.exists() and secret not in json.dumps(outcome.info)
    assert os.environ["LUDIC_TEST_SECRET"] == secret


async def test_a_whole_episode_through_the_protocol() -> None:
    client = ScriptedClient([f"Easy.\n```python\n{SUM_TWO}```"])
    agent = Agent(client, system_prompt=CodeTestEnv.system_prompt)
    env = env_for("sum_two")
    (rollout,) = await SingleAgentProtocol(agent).run(env, env_seed=0)
    (step,) = rollout.env_steps
    assert step.terminated and rollout.total_reward == 1.0
    assert step.info["passed"] == 4


def test_factory_from_json_arguments() -> None:
    env = code_test_env(limit=3, scoring="all_or_nothing", compile_penalty=1.0)
    assert [p.id for p in env.problems] == [p.id for p in load_code_problems()[:3]]
    assert env.scoring == "all_or_nothing" and env.compile_penalty == 1.0


GREEDY = "block = bytearray(200 * 2**20)\nprint(input())\n"  # 200 MiB, then the right answer


async def test_the_env_runs_tests_under_its_pools_limits() -> None:
    # The README's pattern: limits set once on the pool. The env must not swap in its own.
    pool = SandboxPool(limits=SandboxLimits(wall_time_s=5, memory_bytes=128 * 2**20))
    direct = await pool.run_python(GREEDY, stdin="hi\n")
    env = CodeTestEnv([ECHO], pool=pool)
    env.env_reset(seed=0)
    outcome = await env.env_step(f"```python\n{GREEDY}```")
    (test,) = outcome.info["tests"]
    assert direct.limit_hit == "memory" and test["limit_hit"] == "memory", test
    assert outcome.reward == 0.0 and env.run_limits() == pool.limits


async def test_explicit_env_limits_win_over_the_pools() -> None:
    pool = SandboxPool(limits=SandboxLimits(wall_time_s=5, memory_bytes=128 * 2**20))
    roomy = SandboxLimits(wall_time_s=5, memory_bytes=512 * 2**20)
    env = CodeTestEnv([ECHO], pool=pool, limits=roomy)
    env.env_reset(seed=0)
    outcome = await env.env_step(f"```python\n{GREEDY}```")
    assert outcome.reward == 1.0, outcome.info["tests"]
    assert CodeTestEnv([ECHO]).run_limits().cpu_time_s == 4  # shared pool: CODE_LIMITS

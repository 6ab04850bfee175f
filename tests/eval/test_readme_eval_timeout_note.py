"""The README's evaluation block ran on the rollouts block's engine (64 episodes in flight,
`episode_timeout_s=120` from each episode's start); walked on a loaded 2-core machine after
"Generation in another process" had set one torch thread, all 64 timed out and the block printed
0.0 0.0 (the tiny model's 64 games took 259 s there). The block scores on an engine of its own:
no per-episode timeout, no `jsonl_log`, the same concurrency, so it measures the same episodes
on any machine; the section says why."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

README = Path(os.environ.get("LUDIC_README", Path(__file__).resolve().parents[2] / "README.md"))


def _section(heading: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(heading)
    return text[start : text.index("\n## ", start + 1)]


def _first_block(heading: str) -> ast.Module:
    section = _section(heading)
    start = section.index("```python\n") + len("```python\n")
    return ast.parse(section[start : section.index("\n```", start)])


def _engines(block: ast.Module) -> dict[str, dict[str, ast.expr]]:
    """{name: keyword arguments} of each `name = RolloutEngine(...)` in `block`."""
    return {
        node.targets[0].id: {k.arg: k.value for k in node.value.keywords if k.arg}
        for node in ast.walk(block)
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "RolloutEngine"
    }


def _run_eval_engine(block: ast.Module) -> str:
    (call,) = [
        node
        for node in ast.walk(block)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "run_eval"
    ]
    engine = call.args[0]
    assert isinstance(engine, ast.Name)
    return engine.id


def test_the_evaluation_scores_on_its_own_engine_without_a_timeout_or_the_log() -> None:
    rollouts = _engines(_first_block("## From rollouts to samples"))["engine"]
    evaluation = _first_block("## Evaluation, viewer, plots")
    name = _run_eval_engine(evaluation)
    own = _engines(evaluation).get(name)
    assert own is not None, f"run_eval({name}, ...) must get an engine built in the block"
    timeout = own.get("episode_timeout_s")
    assert timeout is None or (isinstance(timeout, ast.Constant) and timeout.value is None)
    assert "jsonl_log" not in own
    assert ast.dump(own["concurrency"]) == ast.dump(rollouts["concurrency"])  # same measure
    assert ast.dump(own["protocol_registry"]) == ast.dump(rollouts["protocol_registry"])


def test_the_evaluation_section_says_why_its_engine_has_no_timeout() -> None:
    section = " ".join(_section("## Evaluation, viewer, plots").split())
    assert "counts each episode from its start" in section
    assert "all 64 can time out" in section
    assert re.search(r"no per-episode timeout and the same `concurrency`", section)

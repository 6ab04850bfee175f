"""The README's Python blocks run as written, in order, in one namespace (a reader following
along in one session). A block whose fence says ```python fragment, or that follows an
`<!-- fragment -->` line, is skipped: keep those rare. A block with top-level `await` runs on
one event loop kept for the whole session, as in `python -m asyncio`, and the text before it
must say so. Blocks run in a temporary working directory, with the tiny local models; the only
budgets this test shrinks are sizes, never which code runs: `Trainer.train` (and so
`Trainer.run`) runs at most `MAX_TRAIN_STEPS` of the steps a block asks for, a
`GRPORequestStrategy` a block builds expands each problem into at most `MAX_GROUP_SIZE`
episodes, and `make_eval_requests` makes at most `MAX_EVAL_PROBLEMS` problems (each with every
sample a block asks for, so its pass@k stays defined). Torch's thread count, which a block sets
as a user's session would, is given back at the end (the tests after this one run as they would
alone)."""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

README = Path(os.environ.get("LUDIC_README", Path(__file__).resolve().parents[1] / "README.md"))
FENCE = re.compile(r"^```python(?P<info>.*)$")
FRAGMENT_MARK = "<!-- fragment -->"
ASYNCIO_HINT = "python -m asyncio"
MAX_FRAGMENTS = 3
MAX_TRAIN_STEPS = 1
MAX_GROUP_SIZE = 2
MAX_EVAL_PROBLEMS = 2


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    code: str
    fragment: bool
    preceding_text: str  # the prose since the previous block (or heading)


def readme_blocks(text: str) -> list[Block]:
    lines = text.splitlines()
    blocks: list[Block] = []
    i, last_end = 0, 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        before = [ln for ln in lines[last_end:start] if ln.strip()]
        fragment = "fragment" in match["info"] or (bool(before) and before[-1] == FRAGMENT_MARK)
        blocks.append(Block(start + 1, "\n".join(body) + "\n", fragment, "\n".join(before)))
        i += 1
        last_end = i
    return blocks


def compiled(block: Block):
    return compile(
        block.code,
        f"{README.name}:{block.line}",
        "exec",
        flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
        dont_inherit=True,
    )


def is_async(block: Block) -> bool:
    return bool(compiled(block).co_flags & inspect.CO_COROUTINE)


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))


def test_the_readme_has_python_blocks_and_few_fragments() -> None:
    runnable = [b for b in BLOCKS if not b.fragment]
    assert len(runnable) >= 5
    fragments = [b.line for b in BLOCKS if b.fragment]
    assert len(fragments) <= MAX_FRAGMENTS, f"fragments at lines {fragments}: keep them rare"


@pytest.mark.parametrize("block", [b for b in BLOCKS if not b.fragment], ids=lambda b: str(b.line))
def test_top_level_await_only_where_the_text_says_python_m_asyncio(block: Block) -> None:
    if is_async(block):
        assert ASYNCIO_HINT in block.preceding_text, (
            f"README.md:{block.line} uses top-level await, but the text before it does not say "
            f"to run it in `{ASYNCIO_HINT}`"
        )


def test_block_extraction_and_fragment_marks() -> None:
    text = "\n".join(
        [
            "Intro. Run it in `python -m asyncio`.",
            "```python",
            "x = await f()",
            "```",
            FRAGMENT_MARK,
            "```python",
            "y = undefined",
            "```",
            "```python fragment",
            "z",
            "```",
            "```bash",
            "ls",
            "```",
        ]
    )
    first, second, third = readme_blocks(text)
    assert (first.line, first.code, first.fragment) == (2, "x = await f()\n", False)
    assert ASYNCIO_HINT in first.preceding_text and is_async(first)
    assert second.fragment and third.fragment


@pytest.mark.slow
@pytest.mark.timeout(1200)  # every block of the README, training included: minutes on 2 cores
def test_every_python_block_runs_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    _cap_budgets(monkeypatch)
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    try:
        _run_blocks()
    finally:
        torch.set_num_threads(threads)


def _cap_budgets(monkeypatch: pytest.MonkeyPatch) -> None:
    import ludic.eval
    import ludic.rollouts
    from ludic.rollouts import GRPORequestStrategy
    from ludic.training import Trainer

    train = Trainer.train

    async def capped(self: Trainer, num_steps: int, **kwargs: object) -> object:
        return await train(self, min(num_steps, MAX_TRAIN_STEPS), **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Trainer, "train", capped)

    def small_group(*, group_size: int) -> GRPORequestStrategy:
        return GRPORequestStrategy(group_size=min(group_size, MAX_GROUP_SIZE))

    # What `from ludic.rollouts import GRPORequestStrategy` gives a block; ludic.eval, already
    # imported, keeps the class (its groups are the samples per problem that pass@k needs).
    monkeypatch.setattr(ludic.rollouts, "GRPORequestStrategy", small_group)
    make_eval_requests = ludic.eval.make_eval_requests

    def few_problems(*, num_problems: int, **kwargs: Any) -> Any:
        return make_eval_requests(num_problems=min(num_problems, MAX_EVAL_PROBLEMS), **kwargs)

    monkeypatch.setattr(ludic.eval, "make_eval_requests", few_problems)


def _run_blocks() -> None:
    namespace: dict[str, object] = {"__name__": "__readme__"}
    loop = asyncio.new_event_loop()  # one loop for the session, as `python -m asyncio` keeps
    try:
        for block in BLOCKS:
            if block.fragment:
                continue
            code = compiled(block)
            try:
                result = eval(code, namespace)
                if inspect.iscoroutine(result):
                    loop.run_until_complete(result)
            except Exception as e:
                raise AssertionError(
                    f"README.md:{block.line} failed: {type(e).__name__}: {e}"
                ) from e
    finally:
        loop.close()

"""The README's Python blocks run as written, in order, in one namespace (a reader following
along in one session). A block whose fence says ```python fragment, or that follows an
`<!-- fragment -->` line, is skipped: keep those rare. A block with top-level `await` runs on
one event loop kept for the whole session, as in `python -m asyncio`, and the text before it
must say so. Blocks run in a temporary working directory, with the tiny local models; the only
budget this test shrinks is training: `Trainer.train` (and so `Trainer.run`) runs at most
`MAX_TRAIN_STEPS` of the steps a block asks for."""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

README = Path(os.environ.get("LUDIC_README", Path(__file__).resolve().parents[1] / "README.md"))
FENCE = re.compile(r"^```python(?P<info>.*)$")
FRAGMENT_MARK = "<!-- fragment -->"
ASYNCIO_HINT = "python -m asyncio"
MAX_FRAGMENTS = 3
MAX_TRAIN_STEPS = 1


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
    from ludic.training import Trainer

    train = Trainer.train

    async def capped(self: Trainer, num_steps: int, **kwargs: object) -> object:
        return await train(self, min(num_steps, MAX_TRAIN_STEPS), **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Trainer, "train", capped)
    monkeypatch.chdir(tmp_path)
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

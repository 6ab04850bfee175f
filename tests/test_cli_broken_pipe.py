"""`ludic --help | head -1`, `ludic view run/rollouts.jsonl | head`: a reader that stops before
the command's output ends closed the pipe, and the `ludic` command printed a BrokenPipeError
traceback (from tyro's help printer, or any print) after the lines the user asked for. It now
ends quietly with 141, as a program killed by SIGPIPE does."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_CONSOLE = "import sys, ludic._console; sys.argv = ['ludic', *sys.argv[1:]]; ludic._console.main()"


@pytest.mark.parametrize("args", [["--help"], ["view", "--help"]])
def test_output_into_a_closed_pipe_ends_quietly(args: list[str]) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes a line
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CONSOLE, *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert done.returncode == 141, done.stderr
    assert done.stderr == "", done.stderr

"""Ctrl-C or SIGTERM while a `ludic` command is still starting (tyro loading and parsing its
config, a second or more on a busy machine) ends it with the one interrupted line and exit code
130 / 143, before the command runs: no KeyboardInterrupt traceback, no silent death by SIGTERM.
An error the interrupted command raises after the signal (a library that turned the
KeyboardInterrupt into its own error, while importing the command's code or running it) is
reported as the interrupt.

Each module below waits, at the moment under test, until the test has sent its signal, so the
signal lands there every time (the SIGTERM hunt hit these moments with delays of 1-3 s)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

_WAIT = """
Path("loading").touch()  # the test sends its signal now
while not Path("go").exists():
    time.sleep(0.01)
"""

_CONFIG_MODULE = """
import dataclasses, time
from pathlib import Path
{wait}
@dataclasses.dataclass
class Config:
    pass

def run(cfg: Config) -> None:
    Path("ran").touch()
"""

_MAIN = """
import sys
from ludic import cli

cli.COMMANDS["starting"] = cli.Command(
    config=sys.argv[1] + ":Config", run=sys.argv[2] + ":run", summary=""
)
cli.main(["starting"])
"""

_RUN_MODULE_IMPORT_WRAPS = """
import time
from pathlib import Path

# As transformers' lazy modules do: an error inside an import comes out as an import error (a
# signal that lands inside numpy's import under them left it half-initialised: RecursionError).
try:
    Path("loading").touch()
    while not Path("go").exists():
        time.sleep(0.01)
except BaseException as e:
    raise ModuleNotFoundError("Could not import module 'PreTrainedModel'") from e

def run(cfg) -> None:
    Path("ran").touch()
"""

_RUN_TURNS_THE_INTERRUPT_INTO_AN_ERROR = """
import time
from pathlib import Path

def run(cfg) -> None:
    try:
        Path("loading").touch()
        while not Path("go").exists():
            time.sleep(0.01)
        Path("ran").touch()
    except KeyboardInterrupt as e:
        raise RuntimeError("the server did not stop cleanly") from e
"""


def _wait_for(path: Path, process: subprocess.Popen[str], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"exited with {process.returncode} first:\n{out}\n{err}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"{path.name} did not appear in time")
        time.sleep(0.01)


@pytest.mark.parametrize(
    ("signum", "code", "why"), [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")]
)
def test_a_signal_while_the_command_starts_ends_it_with_one_line(
    tmp_path: Path, signum: int, code: int, why: str
) -> None:
    (tmp_path / "waiting_config.py").write_text(_CONFIG_MODULE.format(wait=_WAIT))
    err = _interrupt(tmp_path, "waiting_config", "waiting_config", signum, code)
    assert err.strip() == f"ludic starting: interrupted ({why})", err
    assert not (tmp_path / "ran").exists()  # stopped before the command ran


def test_a_signal_a_library_turns_into_an_import_error_is_reported_as_the_interrupt(
    tmp_path: Path,
) -> None:
    (tmp_path / "starting_code.py").write_text(_RUN_MODULE_IMPORT_WRAPS)
    err = _interrupt(tmp_path, "plain_config", "starting_code", signal.SIGTERM, 143)
    assert err.strip() == "ludic starting: interrupted (SIGTERM)", err
    assert not (tmp_path / "ran").exists()


def test_an_error_the_interrupted_command_raises_is_reported_as_the_interrupt(
    tmp_path: Path,
) -> None:
    (tmp_path / "running.py").write_text(_RUN_TURNS_THE_INTERRUPT_INTO_AN_ERROR)
    err = _interrupt(tmp_path, "plain_config", "running", signal.SIGTERM, 143)
    assert err.strip() == "ludic starting: interrupted (SIGTERM)", err


def _interrupt(
    tmp_path: Path, config: str, run: str, signum: int, code: int, *, script: str = _MAIN
) -> str:
    """Start the `starting` command (config and run from those modules) with `script`, send
    `signum` once `loading` appears, let it go on, and return its stderr after checking its
    exit code."""
    (tmp_path / "plain_config.py").write_text(_CONFIG_MODULE.format(wait=""))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    process = subprocess.Popen(
        [sys.executable, "-c", script, config, run],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a background job starts with SIGINT ignored, which the command keeps ignoring
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    _wait_for(tmp_path / "loading", process)
    process.send_signal(signum)
    (tmp_path / "go").touch()
    try:
        _, err = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    assert process.returncode == code, err
    return err


_CONSOLE_SCRIPT = """
import sys, time
from pathlib import Path
import ludic._console  # the console script's first import: signals are recorded from here

Path("loading").touch()  # the signal lands before ludic.cli is imported
while not Path("go").exists():
    time.sleep(0.01)
from ludic import cli

cli.COMMANDS["starting"] = cli.Command(
    config="plain_config:Config", run="plain_config:run", summary=""
)
sys.argv = ["ludic", "starting"]
ludic._console.main()
"""


@pytest.mark.parametrize(
    ("signum", "code", "why"), [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")]
)
def test_a_signal_before_the_cli_module_loads_ends_the_command_with_one_line(
    tmp_path: Path, signum: int, code: int, why: str
) -> None:
    err = _interrupt(tmp_path, "", "", signum, code, script=_CONSOLE_SCRIPT)
    assert err.strip() == f"ludic starting: interrupted ({why})", err
    assert not (tmp_path / "ran").exists()


def test_the_console_script_enters_through_the_light_module() -> None:
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert 'ludic = "ludic._console:main"' in pyproject
    code = "import sys, ludic._console; print(sorted(m for m in sys.modules if 'ludic' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['ludic', 'ludic._console']", out.stdout

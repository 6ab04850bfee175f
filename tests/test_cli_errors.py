"""A refused `ludic` command (bad input or setup) ends with one block, `ludic <command>: error:
<message>` and `(LUDIC_TRACEBACK=1 shows the traceback)`, and exit code 1, never a traceback;
LUDIC_TRACEBACK=1 brings the traceback back; a bug (a TypeError, a ValueError raised by the
user's own code or by the standard library) keeps its traceback. Each runs the real command in
a subprocess, as a user types it."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ludic import cli
from ludic.errors import LudicUsageError, is_refusal, raised_by_ludic
from ludic.recipes.run_lock import LUDIC_RUN, RUN_LOCK, run_lock
from ludic.rollouts import read_rollouts_jsonl
from ludic.training.loggers import JsonlLogger

HINT = "(LUDIC_TRACEBACK=1 shows the traceback)"


def ludic(
    *args: str | Path, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "HF_HUB_OFFLINE": "1"}
    environ.pop("LUDIC_TRACEBACK", None)
    return subprocess.run(
        [sys.executable, "-m", "ludic.cli", *map(str, args)],
        cwd=cwd,
        env={**environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def script(
    code: str, *, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `code` (which ends by calling `cli.main()` with sys.argv set, as the console script
    does) in a fresh interpreter."""
    (cwd / "run_cli.py").write_text(textwrap.dedent(code))
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    environ.pop("LUDIC_TRACEBACK", None)
    return subprocess.run(
        [sys.executable, "run_cli.py"],
        cwd=cwd,
        env={**environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def metrics_file(tmp_path: Path) -> Path:
    logger = JsonlLogger(tmp_path / "metrics.jsonl")
    logger.log({"loss": 0.5}, step=1)
    logger.close()
    return tmp_path / "metrics.jsonl"


def refusal_of(result: subprocess.CompletedProcess[str], command: str) -> str:
    """The message of the refusal block `result` ended with, after checking the block's form:
    exit code 1, no traceback, `ludic <command>: error: ` then the message, the hint last."""
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    head = f"ludic {command}: error: "
    assert result.stderr.count(head) == 1, result.stderr[-3000:]
    block = result.stderr[result.stderr.index(head) :]
    assert block.endswith(f"\n{HINT}\n"), block
    return block[len(head) : -len(HINT) - 2]


def test_ludic_view_of_a_metrics_file_is_one_clean_block(tmp_path: Path) -> None:
    metrics = metrics_file(tmp_path)
    message = refusal_of(ludic("view", metrics, cwd=tmp_path), "view")
    assert message.startswith(f"{metrics}:1: a training metrics record")
    assert f"ludic plot {metrics}" in message
    assert not (tmp_path / "metrics.html").exists()


def test_ludic_traceback_1_brings_the_traceback_back(tmp_path: Path) -> None:
    metrics = metrics_file(tmp_path)
    result = ludic("view", metrics, cwd=tmp_path, env={"LUDIC_TRACEBACK": "1"})
    assert result.returncode == 1
    assert result.stderr.startswith("Traceback (most recent call last):"), result.stderr
    assert f"ValueError: {metrics}:1: a training metrics record" in result.stderr
    assert "ludic view: error:" not in result.stderr and HINT not in result.stderr
    quiet = ludic("view", metrics, cwd=tmp_path, env={"LUDIC_TRACEBACK": "0"})
    refusal_of(quiet, "view")  # 0 is off


def test_ludic_eval_with_an_unknown_or_missing_env(tmp_path: Path) -> None:
    message = refusal_of(ludic("eval", "--env", "no_such_env", cwd=tmp_path), "eval")
    assert message.startswith("unknown env 'no_such_env'; built-in envs: [")
    message = refusal_of(ludic("eval", "--env", "no_module:make", cwd=tmp_path), "eval")
    assert "cannot import module 'no_module'" in message


def test_a_missing_file_named_by_the_os_is_a_refusal(tmp_path: Path) -> None:
    """An OS file error that names its file (here from `open` inside a command) reads as a
    refusal, not a traceback: the commands' own checks say more, but not every open has one."""
    result = script(
        """
        import sys
        from ludic import cli
        from ludic.viz import viewer

        def view_command(cfg):
            open("absent.jsonl", encoding="utf-8")

        viewer.view_command = view_command
        sys.argv = ["ludic", "view", "x.jsonl"]
        cli.main()
        """,
        cwd=tmp_path,
    )
    message = refusal_of(result, "view")
    assert "No such file or directory" in message and "absent.jsonl" in message


def test_a_multi_line_message_keeps_every_line(tmp_path: Path) -> None:
    result = script(
        """
        import sys
        from ludic import cli
        from ludic.errors import LudicUsageError
        from ludic.viz import viewer

        def view_command(cfg):
            print("written before the error")
            raise LudicUsageError("first line\\n  second line\\nthird line")

        viewer.view_command = view_command
        sys.argv = ["ludic", "view", "x.jsonl"]
        cli.main()
        """,
        cwd=tmp_path,
    )
    assert refusal_of(result, "view") == "first line\n  second line\nthird line"
    assert result.stdout == "written before the error\n"


@pytest.mark.slow
def test_ludic_train_with_a_model_path_that_does_not_exist(tmp_path: Path) -> None:
    result = ludic("train", "--model", "/nonexist", "--out-dir", "out", cwd=tmp_path)
    message = refusal_of(result, "train")
    assert message.startswith("no model directory at /nonexist ")


@pytest.mark.slow
def test_ludic_train_under_torchrun_and_in_a_directory_another_run_holds(tmp_path: Path) -> None:
    ranked = ludic("train", "--out-dir", "a", cwd=tmp_path, env={"WORLD_SIZE": "2", "RANK": "1"})
    assert "runs in one process, but this is rank 1 of WORLD_SIZE=2" in refusal_of(ranked, "train")
    held = tmp_path / "held"
    held.mkdir()
    with run_lock(held / RUN_LOCK, what=LUDIC_RUN):
        busy = ludic("train", "--out-dir", held, cwd=tmp_path)
    assert "in use by another ludic run" in refusal_of(busy, "train")


@pytest.mark.slow
def test_python_m_ludic_pipeline_reports_a_refusal_as_ludic_does(tmp_path: Path) -> None:
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "HF_HUB_OFFLINE": "1"}
    environ.pop("LUDIC_TRACEBACK", None)
    result = subprocess.run(
        [sys.executable, "-m", "ludic.pipeline", "learner", "--model", "/nonexist"],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert refusal_of(result, "learner").startswith("no model directory at /nonexist")


def test_a_refusal_raised_on_a_worker_thread_and_re_raised_is_reported_the_same(
    tmp_path: Path,
) -> None:
    metrics = metrics_file(tmp_path)
    result = script(
        f"""
        import sys
        from concurrent.futures import ThreadPoolExecutor
        from ludic import cli
        from ludic.rollouts import read_rollouts_jsonl
        from ludic.viz import viewer

        def view_command(cfg):
            with ThreadPoolExecutor(1) as pool:
                pool.submit(read_rollouts_jsonl, cfg.rollouts).result()

        viewer.view_command = view_command
        sys.argv = ["ludic", "view", {str(metrics)!r}]
        cli.main()
        """,
        cwd=tmp_path,
    )
    assert refusal_of(result, "view").startswith(f"{metrics}:1: a training metrics record")


BUG = """
import sys
from ludic import cli
from ludic.viz import viewer

def view_command(cfg):
    {body}

viewer.view_command = view_command
sys.argv = ["ludic", "view", "x.jsonl"]
cli.main()
"""


@pytest.mark.parametrize(
    ("body", "last_line"),
    [
        ("raise TypeError('a bug, not a refusal')", "TypeError: a bug, not a refusal"),
        ("import json; json.loads('not json')", "json.decoder.JSONDecodeError: Expecting value"),
        ("{}['missing']", "KeyError: 'missing'"),
    ],
)
def test_a_bug_keeps_its_traceback(tmp_path: Path, body: str, last_line: str) -> None:
    result = script(BUG.format(body=body), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("Traceback (most recent call last):"), result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(last_line), result.stderr
    assert "error:" not in result.stderr.replace(last_line, "") and HINT not in result.stderr


LUDIC_DIR = Path(cli.__file__).resolve().parent


def in_ludic(source: str, name: str = "_probe") -> dict[str, object]:
    """The namespace of `source` compiled as if it were a module file inside the `ludic`
    package (nothing is written there), so its frames count as ludic's own code."""
    namespace: dict[str, object] = {"__name__": f"ludic.{name}"}
    exec(compile(textwrap.dedent(source), str(LUDIC_DIR / f"{name}.py"), "exec"), namespace)
    return namespace


LUDIC_BUGS = {
    "unpacking": "a, b = (1, 2, 3)",
    "zip_strict": "list(zip([1], [1, 2], strict=True))",
    "zip_strict_loop": "for _ in zip([1], [1, 2], strict=True):\n        pass",
    "int": "int('x')",
    "bare_reraise": "try:\n        int('x')\n    except ValueError:\n        raise",
    "in_raise_args": "raise ValueError(f'{int(\"x\")}')",
}


@pytest.mark.parametrize("name", sorted(LUDIC_BUGS))
def test_a_value_error_a_builtin_raised_inside_ludic_is_a_bug(name: str) -> None:
    bug = in_ludic(f"def bug():\n    {LUDIC_BUGS[name]}\n")["bug"]
    with pytest.raises(ValueError) as caught:
        bug()  # type: ignore[operator]
    assert not raised_by_ludic(caught.value) and not is_refusal(caught.value)
    assert Path(caught.traceback[-1].path).is_relative_to(LUDIC_DIR)  # innermost frame: ludic


def test_an_explicit_raise_in_ludic_is_a_refusal(tmp_path: Path) -> None:
    module = in_ludic(
        """
        def one_line():
            raise ValueError("bad input; pass --x instead")

        def multi_line(value):
            raise ValueError(
                f"bad input {value!r}; "
                "pass --x instead"
            )

        def chained():
            try:
                int("x")
            except ValueError as e:
                raise ValueError("not a number; pass an int") from e

        def file_error(path):
            raise FileNotFoundError(
                f"no model directory at {path}; pass --model DIR"
            )

        def opened(path):
            with open(path) as f:
                return f.read()
        """
    )
    calls = [("one_line",), ("multi_line", 3), ("chained",), ("file_error", "/nonexist")]
    for name, *args in calls:
        with pytest.raises((ValueError, FileNotFoundError)) as caught:
            module[name](*args)  # type: ignore[operator]
        assert raised_by_ludic(caught.value) and is_refusal(caught.value), name
    with pytest.raises(FileNotFoundError) as opened:
        module["opened"](tmp_path / "absent.txt")  # type: ignore[operator]
    assert not raised_by_ludic(opened.value)  # open() raised it, not a `raise` ...
    assert is_refusal(opened.value)  # ... but the OS's message names the file


def test_ludic_keeps_the_traceback_of_a_value_error_a_builtin_raised_in_ludic(
    tmp_path: Path,
) -> None:
    result = script(
        f"""
        import sys
        from ludic import cli
        from ludic.viz import viewer

        source = "def view_command(cfg):\\n    a, b = (1, 2, 3)\\n"
        namespace = {{}}
        exec(compile(source, {str(LUDIC_DIR / "viz" / "_probe.py")!r}, "exec"), namespace)
        viewer.view_command = namespace["view_command"]
        sys.argv = ["ludic", "view", "x.jsonl"]
        cli.main()
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("Traceback (most recent call last):"), result.stderr
    assert "_probe.py" in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last == "ValueError: too many values to unpack (expected 2)", result.stderr
    assert "error:" not in result.stderr and HINT not in result.stderr


def test_a_value_error_from_the_users_own_env_keeps_its_traceback(tmp_path: Path) -> None:
    (tmp_path / "my_env.py").write_text(
        "def make(**kwargs):\n    raise ValueError('my own env is broken')\n"
    )
    result = ludic("eval", "--env", "my_env:make", "--num-problems", "1", cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback (most recent call last):" in result.stderr, result.stderr[-3000:]
    assert 'my_env.py", line 2, in make' in result.stderr
    assert "ValueError: my own env is broken" in result.stderr and HINT not in result.stderr


def test_from_python_main_with_argv_raises_and_report_refusals_prints_the_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = metrics_file(tmp_path)
    with pytest.raises(ValueError, match="a training metrics record"):
        cli.main(["view", str(metrics)])
    with pytest.raises(SystemExit) as exit_:
        cli.main(["view", str(metrics)], report_refusals=True)
    assert exit_.value.code == cli.EXIT_REFUSED == 1
    err = capsys.readouterr().err
    assert err.startswith(f"ludic view: error: {metrics}:1: ") and err.endswith(f"\n{HINT}\n")


def test_which_errors_are_refusals(tmp_path: Path) -> None:
    metrics = metrics_file(tmp_path)
    with pytest.raises(ValueError) as ours:
        read_rollouts_jsonl(metrics)
    assert raised_by_ludic(ours.value) and is_refusal(ours.value)
    with ThreadPoolExecutor(1) as pool, pytest.raises(ValueError) as threaded:
        pool.submit(read_rollouts_jsonl, metrics).result()
    assert is_refusal(threaded.value)
    with pytest.raises(ValueError) as stdlib:
        json.loads("not json")
    assert not raised_by_ludic(stdlib.value) and not is_refusal(stdlib.value)
    with pytest.raises(FileNotFoundError) as os_error:
        (tmp_path / "absent").read_text()
    assert is_refusal(os_error.value)  # the OS's message names the file
    assert is_refusal(LudicUsageError("raised anywhere, even never raised"))
    assert not is_refusal(ValueError("never raised: no traceback to say whose"))
    for bug in (TypeError("x"), AttributeError("x"), KeyError("x"), RuntimeError("x")):
        assert not is_refusal(bug)


def test_ludics_own_refusal_classes_that_are_not_value_errors() -> None:
    from ludic.inference.http.local_server import _ExitedEarly
    from ludic.inference.http.openai_client import InferenceUnavailableError
    from ludic.pipeline.stream import RedisUnavailableError
    from ludic.recipes.run_lock import MultiProcessLaunchError, RunDirInUseError
    from ludic.training.stall import TrainingStalledError
    from ludic.training.weights_io import CorruptCheckpointError

    refusals = [
        RunDirInUseError("x"),
        MultiProcessLaunchError("x"),
        CorruptCheckpointError("x"),
        _ExitedEarly("the child server exited; its output ends: ...", log=""),
        RedisUnavailableError("x"),
        InferenceUnavailableError("x"),
        TrainingStalledError("training stalled: ... What to do: ..."),
    ]
    assert all(is_refusal(e) for e in refusals)
    assert not is_refusal(RuntimeError("one torch raised"))


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC, errno.EDQUOT])
def test_a_read_only_or_full_disk_naming_its_path_is_one_line(code: int) -> None:
    # `ludic eval --out-dir` on a read-only filesystem printed a whole OSError traceback
    assert is_refusal(OSError(code, os.strerror(code), "/mnt/ro/runs/eval"))
    assert not is_refusal(OSError(code, os.strerror(code)))  # no path: where is unknown
    assert not is_refusal(OSError(errno.EIO, os.strerror(errno.EIO), "/mnt/ro/runs/eval"))

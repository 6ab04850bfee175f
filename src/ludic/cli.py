"""The `ludic` command: one subcommand per workflow, each configured by one dataclass.

Field docstrings of each config are its `--help` (tyro). `ludic <command> ...` imports only that
command's config, and torch, models and servers load when the command runs, so `--help` stays
fast. Each command calls one public function that works from Python too (named below). The
working directory is importable, so `--env my_env:make_env` finds ./my_env.py.

Ctrl-C (SIGINT) or SIGTERM stops a command through its cleanup (`finally` blocks and `with`
exits run: servers stop, files close) and ends it with one line naming the newest checkpoint
this run saved (or the one it resumed from; never one an earlier run left in the same
directory), where the command saves them, and exit code 130 or 143, instead of a traceback.
One that arrives while the process starts (recorded from `ludic._console`, the console script's
first module) or tyro imports and parses the command's flags waits until that is done, then
stops the command before it runs; a first one that arrives while a checkpoint is saved
waits until the save completes, so the line names it (a second stops the save at once, rolled
back: `ludic.training.checkpoint_signals`); an error the interrupted command raises after it is
reported as the interrupt.

A refusal (bad input or setup whose message says what to do: `ludic.errors.is_refusal`, e.g. a
model path that does not exist, a metrics file given to `ludic view`) ends the command with one
block, `ludic <command>: error: <message>` and `(LUDIC_TRACEBACK=1 shows the traceback)`, and
exit code 1; with LUDIC_TRACEBACK=1 in the environment its traceback prints as for any error.
Any other error (a bug) keeps its traceback, exit code 1. Called from Python with `argv`,
`main` raises every error unless `report_refusals=True`.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

DESCRIPTION = (
    "Ludic: train LLM agents with reinforcement learning. Start with `ludic quickstart`: it "
    "trains a tiny model to play tic-tac-toe on your CPU in a few minutes."
)


@dataclass(frozen=True, slots=True)
class ScopedFlags:
    """Flags that one setting's value reads (`--gigpo.*` only `--algorithm gigpo`): typed with
    another value they would be ignored, so the command refuses them. Checked on the typed
    arguments, so a flag typed at its default value is refused too (the config cannot tell it
    from one left out)."""

    prefix: str
    setting: str
    value: str

    def typed(self, args: Sequence[str]) -> list[str]:
        """The flags in `args` under this prefix, as typed (without a `=value`)."""
        flags = (arg.split("=", 1)[0] for arg in args if arg.startswith("--"))
        return [flag for flag in flags if flag.replace("_", "-").startswith(self.prefix)]

    def check(self, cfg: Any, args: Sequence[str]) -> None:
        current = getattr(cfg, self.setting)
        typed = self.typed(args)
        if not typed or current == self.value:
            return
        them, apply = ("it", "applies") if len(typed) == 1 else ("them", "apply")
        option = "--" + self.setting.replace("_", "-")
        raise ValueError(
            f"{' '.join(typed)} {apply} only to {option} {self.value}, not {current!r} (which "
            f"would ignore {them}): drop {them} or pass {option} {self.value}"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Command:
    """A subcommand: its config class and the function that runs it, as import strings, and
    the one-line summary `ludic --help` lists (so listing the commands imports none of them)."""

    config: str
    run: str
    summary: str
    checkpoints: tuple[str, ...] = ()
    """Where the command saves checkpoints, relative to its config's `out_dir` (the first that
    holds one this run saved is named when the command is interrupted)."""
    scoped: tuple[ScopedFlags, ...] = ()
    """Flags refused unless a setting has one value (`ScopedFlags`), checked once parsed."""

    def load_config(self) -> type[Any]:
        return _import(self.config)  # type: ignore[no-any-return]

    def execute(self, cfg: Any) -> None:
        _import(self.run)(cfg)


_GIGPO_FLAGS = ScopedFlags("--gigpo.", "algorithm", "gigpo")

COMMANDS: dict[str, Command] = {
    "quickstart": Command(
        config="ludic.recipes.configs:QuickstartConfig",
        run="ludic.recipes.quickstart:run_quickstart",
        summary="Train a tiny model at tic-tac-toe from scratch on the CPU: expert data, SFT, "
        "GRPO, and a before/after table.",
        checkpoints=("rl/checkpoints", "sft/checkpoints"),
    ),
    "train": Command(
        config="ludic.recipes.configs:TrainConfig",
        run="ludic.recipes.train:train_command",
        summary="Online RL (GRPO and other presets) on a built-in or user env.",
        checkpoints=("checkpoints",),
        scoped=(_GIGPO_FLAGS,),
    ),
    "sft": Command(
        config="ludic.recipes.configs:SFTConfig",
        run="ludic.recipes.sft:sft_command",
        summary="Supervised fine-tuning on stored rollouts (JSONL).",
        checkpoints=("checkpoints",),
        scoped=(ScopedFlags("--awr-", "algorithm", "awr"),),
    ),
    "eval": Command(
        config="ludic.eval.command:EvalConfig",
        run="ludic.eval.command:run_eval_command",
        summary="Evaluate a model or an inference server on an env; print a summary table.",
        scoped=(ScopedFlags("--gigpo.", "credit", "gigpo"),),
    ),
    "serve": Command(
        config="ludic.inference.http.serve_config:ServeConfig",
        run="ludic.inference.http.server:serve",
        summary="Serve a local model over an OpenAI-compatible HTTP API (embedded engine).",
    ),
    "actor": Command(
        config="ludic.pipeline.config:ActorConfig",
        run="ludic.pipeline.commands:actor_command",
        summary="Pipeline actor: generate rollouts with the served policy and push samples to "
        "Redis.",
        scoped=(_GIGPO_FLAGS,),
    ),
    "learner": Command(
        config="ludic.pipeline.config:LearnerConfig",
        run="ludic.pipeline.commands:learner_command",
        summary="Pipeline learner: train on samples from Redis and publish weights to the "
        "inference server.",
        checkpoints=("checkpoints",),
    ),
    "view": Command(
        config="ludic.viz.viewer:ViewConfig",
        run="ludic.viz.viewer:view_command",
        summary="Write a self-contained HTML page to browse rollouts and their tokens.",
    ),
    "plot": Command(
        config="ludic.viz.plots:PlotConfig",
        run="ludic.viz.plots:plot_command",
        summary="Plot a training metrics JSONL as PNG curves.",
    ),
}


def _import(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def main(argv: Sequence[str] | None = None, *, report_refusals: bool | None = None) -> None:
    """Parse `argv` (default: the process arguments) and run the chosen command.

    `report_refusals` (default: True when `argv` is None, i.e. run as the `ludic` command) prints
    a refusal as one `ludic <command>: error: ...` block and exits with `EXIT_REFUSED`, instead
    of raising it (see the module docstring)."""
    _entry(argv, report_refusals, [])


def console_main(received: list[int]) -> None:
    """The `ludic` console script (`ludic._console`, which records SIGINT and SIGTERM from the
    process's start): `main()` with the signals `received` before this module loaded. Output
    piped into a reader that stops early (`ludic view ... | head`) ends the command quietly
    with 141, as a program killed by SIGPIPE does, not with a BrokenPipeError traceback."""
    try:
        _entry(None, None, received)
    except BrokenPipeError:
        # Python flushes stdout once more at exit: into /dev/null, not the closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(EXIT_BROKEN_PIPE) from None


def _entry(argv: Sequence[str] | None, report_refusals: bool | None, received: list[int]) -> None:
    try:
        _main(argv, report_refusals, received)
    finally:
        if argv is None:
            # The `ludic` process ends here: leave its objects out of the interpreter's last
            # garbage collections, which walk every object torch and transformers created
            # (about 2 s on 2 cores, far more under load: the wait after an interrupted line).
            # Their memory goes back with the process; every file Ludic writes is flushed.
            gc.freeze()


def _main(argv: Sequence[str] | None, report_refusals: bool | None, received: list[int]) -> None:
    # received: SIGINT / SIGTERM, from here on (the console script's: from the process's start)
    with _signals_recorded(received):  # until the command's own handler is set
        import tyro  # here: tyro and the parsing take a second on a busy machine

        from ludic.errors import is_refusal

        args = list(sys.argv[1:] if argv is None else argv)
        _import_from_cwd()
        if args and args[0] in COMMANDS:
            report = argv is None if report_refusals is None else report_refusals
            try:
                _run_command(args[0], args[1:], received)
            except Exception as e:
                if not report or not is_refusal(e) or traceback_wanted():
                    raise
                _report_refusal(args[0], e)
                raise SystemExit(EXIT_REFUSED) from None
            return
        # No command named (or an unknown one): tyro lists the commands, or says what is
        # wrong. Any valid command took the branch above, so the listing needs only summaries.
        listing = {name: _listed(command.summary) for name, command in COMMANDS.items()}
        tyro.extras.subcommand_cli_from_dict(
            listing, description=DESCRIPTION, args=args, prog="ludic"
        )
        if received:
            raise SystemExit(_exit_code(received[0]))


def _run_command(name: str, args: list[str], received: list[int]) -> None:
    import tyro

    command = COMMANDS[name]
    config_type = command.load_config()
    cfg = tyro.cli(config_type, args=args, prog=f"ludic {name}")
    for scoped in command.scoped:
        scoped.check(cfg, args)
    started = time.time()
    try:
        with _signals_interrupt(received):
            if received:  # arrived while the command started: it stops before it runs
                raise Terminated() if received[0] == signal.SIGTERM else KeyboardInterrupt()
            command.execute(cfg)
    except KeyboardInterrupt as e:
        received.append(signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)
    except Exception:
        # After a signal, an error is the interrupted code's: a library that turned the
        # KeyboardInterrupt into its own error (one landing inside transformers' imports left
        # numpy half-imported: a RecursionError it reports as ModuleNotFoundError), a cleanup
        # cut short. The run stopped because it was asked to. LUDIC_TRACEBACK=1 shows it.
        if not received or traceback_wanted():
            raise
    if received:  # also when a library caught the signal and returned (uvicorn does)
        terminated = received[0] == signal.SIGTERM
        line = _interrupted_line(name, command, cfg, terminated, started=started)
        print(line, file=sys.stderr, flush=True)
        raise SystemExit(_exit_code(received[0]))


def _exit_code(signum: int) -> int:
    return 143 if signum == signal.SIGTERM else 130


EXIT_BROKEN_PIPE = 128 + 13
"""The exit code when the reader of the command's output went away (128 + SIGPIPE)."""

EXIT_REFUSED = 1
"""The exit code of a refused command (as before refusals were reported; tyro's own parse
errors exit with 2)."""

TRACEBACK_ENV = "LUDIC_TRACEBACK"
TRACEBACK_HINT = f"({TRACEBACK_ENV}=1 shows the traceback)"


def traceback_wanted() -> bool:
    """True when LUDIC_TRACEBACK is set to anything but empty or 0: refusals then raise."""
    return os.environ.get(TRACEBACK_ENV, "").strip() not in ("", "0")


def refusal_block(name: str, exc: BaseException) -> str:
    """The lines a refused `ludic <name>` prints: its message (every line of it) and the hint."""
    message = str(exc).strip() or type(exc).__name__
    return f"ludic {name}: error: {message}\n{TRACEBACK_HINT}"


def _report_refusal(name: str, exc: BaseException) -> None:
    sys.stdout.flush()  # what the command printed comes before its error
    print(refusal_block(name, exc), file=sys.stderr, flush=True)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so that cleanup runs the same way."""


def _drop_interrupt_tracebacks(record: logging.LogRecord) -> bool:
    """A logging filter for asyncio: a signal that lands inside one of several gathered tasks
    leaves that task finished with the KeyboardInterrupt, and asyncio later logs "Task
    exception was never retrieved" with its traceback. The command already reports the
    interrupt in one line; every other asyncio record passes."""
    exc = record.exc_info[1] if record.exc_info else None
    return not isinstance(exc, KeyboardInterrupt)


@contextmanager
def _signals_interrupt(received: list[int]) -> Iterator[None]:
    """While the command runs, SIGINT raises KeyboardInterrupt and SIGTERM `Terminated` in the
    main thread (Python's default for SIGTERM ends the process at once, skipping `finally`
    blocks, so a child server would be left running), and each is recorded in `received`: a
    library that handles a signal itself and returns (uvicorn re-raises it into this handler
    after its graceful shutdown, inside a coroutine) still ends the command as interrupted.
    Off the main thread (main() called from a thread) signals cannot be set: no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    logging.getLogger("asyncio").addFilter(_drop_interrupt_tracebacks)  # kept: tasks die at exit

    def interrupt(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    with _handled_by(interrupt):
        yield


@contextmanager
def _signals_recorded(received: list[int]) -> Iterator[None]:
    """From the start of `main` until `_signals_interrupt` takes over, SIGINT and SIGTERM are
    only recorded in `received`, and the command then stops before it runs, with the one line
    and exit code: Python's own handlers would print a KeyboardInterrupt traceback for Ctrl-C
    while tyro loads or parses (a second or more on a busy machine) and end the process on
    SIGTERM with neither the line nor 143. Nothing has started then, so nothing needs stopping
    sooner. Off the main thread, or for a signal the process was started ignoring: no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def record(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    with _handled_by(record):
        yield


@contextmanager
def _handled_by(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """SIGINT and SIGTERM go to `handler`, then back to their handlers before. A signal the
    process was started ignoring (`nohup`, a background job) stays ignored."""
    signals = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) != signal.SIG_IGN]
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


def _interrupted_line(
    name: str, command: Command, cfg: Any, terminated: bool, *, started: float
) -> str:
    """The one line an interrupted command ends with: the newest checkpoint saved since
    `started` (time.time() when the command began), else the one `cfg.resume` resumed from,
    else that this run saved none (a checkpoint an earlier run left is never named)."""
    line = f"ludic {name}: interrupted ({'SIGTERM' if terminated else 'Ctrl-C'})"
    out_dir = getattr(cfg, "out_dir", None)
    if not command.checkpoints or out_dir is None:
        return line
    roots = [Path(out_dir) / relative for relative in command.checkpoints]
    for root in roots:
        checkpoint = _newest_checkpoint(root, since=started)
        if checkpoint is not None:
            return f"{line}; last checkpoint: {checkpoint}"
    resumed = _resumed_checkpoint(getattr(cfg, "resume", None), roots[0])
    if resumed is not None:
        return f"{line}; last checkpoint: {resumed} (the one it resumed from; none saved since)"
    return f"{line}; no checkpoint saved by this run under {out_dir}"


_MTIME_SLACK_S = 1.0  # a file system's coarse timestamps may round a new mtime down


def _newest_checkpoint(root: Path, *, since: float | None = None) -> Path | None:
    """The highest-numbered complete `step_N` directory under `root` (one holding its
    MANIFEST.json: resume skips one without, a save that never finished), with `since`: only
    those written after that time (their mtime), without importing the training stack."""
    if not root.is_dir():
        return None
    steps = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _STEP.match(p.name)) and (p / _MANIFEST).is_file()
    ]
    if since is not None:
        steps = [(n, p) for n, p in steps if _mtime(p) >= since - _MTIME_SLACK_S]
    return max(steps)[1] if steps else None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile (the trainer keeps the last few)
        return float("-inf")


def _resumed_checkpoint(resume: object, root: Path) -> Path | None:
    """The checkpoint `--resume` named: bare (`"latest"`) the newest under `root`, a `step_N`
    directory itself, or the newest in a directory of them (None without --resume)."""
    if not isinstance(resume, str):
        return None
    if resume == "latest":
        return _newest_checkpoint(root)
    path = Path(resume)
    if _STEP.match(path.name) and path.is_dir():
        return path
    return _newest_checkpoint(path)


_STEP = re.compile(r"^step_(\d+)$")
_MANIFEST = "MANIFEST.json"  # ludic.training.checkpoint writes it last


def _import_from_cwd() -> None:
    """Make the working directory importable, as `python -m` does, so `--env my_env:factory`
    and `--parser my_env:parser` find ./my_env.py (a console script's sys.path lacks it)."""
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.insert(0, cwd)


def _listed(summary: str) -> Any:
    def command() -> None:
        raise AssertionError("a named command is parsed by its own config")

    command.__doc__ = summary
    return command


if __name__ == "__main__":
    main()

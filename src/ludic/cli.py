"""The `ludic` command: one subcommand per workflow, each configured by one dataclass.

Field docstrings of each config are its `--help` (tyro). `ludic <command> ...` imports only that
command's config, and torch, models and servers load when the command runs, so `--help` stays
fast. Each command calls one public function that works from Python too (named below). The
working directory is importable, so `--env my_env:make_env` finds ./my_env.py.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tyro

DESCRIPTION = (
    "Ludic: train LLM agents with reinforcement learning. Start with `ludic quickstart`: it "
    "trains a tiny model to play tic-tac-toe on your CPU in a few minutes."
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Command:
    """A subcommand: its config class and the function that runs it, as import strings, and
    the one-line summary `ludic --help` lists (so listing the commands imports none of them)."""

    config: str
    run: str
    summary: str

    def load_config(self) -> type[Any]:
        return _import(self.config)  # type: ignore[no-any-return]

    def execute(self, cfg: Any) -> None:
        _import(self.run)(cfg)


COMMANDS: dict[str, Command] = {
    "quickstart": Command(
        config="ludic.recipes.configs:QuickstartConfig",
        run="ludic.recipes.quickstart:run_quickstart",
        summary="Train a tiny model at tic-tac-toe from scratch on the CPU: expert data, SFT, "
        "GRPO, and a before/after table.",
    ),
    "train": Command(
        config="ludic.recipes.configs:TrainConfig",
        run="ludic.recipes.train:train_command",
        summary="Online RL (GRPO and other presets) on a built-in or user env.",
    ),
    "sft": Command(
        config="ludic.recipes.configs:SFTConfig",
        run="ludic.recipes.sft:sft_command",
        summary="Supervised fine-tuning on stored rollouts (JSONL).",
    ),
    "eval": Command(
        config="ludic.eval.command:EvalConfig",
        run="ludic.eval.command:run_eval_command",
        summary="Evaluate a model or an inference server on an env; print a summary table.",
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
    ),
    "learner": Command(
        config="ludic.pipeline.config:LearnerConfig",
        run="ludic.pipeline.commands:learner_command",
        summary="Pipeline learner: train on samples from Redis and publish weights to the "
        "inference server.",
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


def main(argv: Sequence[str] | None = None) -> None:
    """Parse `argv` (default: the process arguments) and run the chosen command."""
    args = list(sys.argv[1:] if argv is None else argv)
    _import_from_cwd()
    if args and args[0] in COMMANDS:
        name, command = args[0], COMMANDS[args[0]]
        config_type = command.load_config()
        cfg = tyro.cli(config_type, args=args[1:], prog=f"ludic {name}")
        command.execute(cfg)
        return
    # No command named (or an unknown one): tyro lists the commands, or says what is wrong.
    # Any valid command took the branch above, so the listing needs only the summaries.
    listing = {name: _listed(command.summary) for name, command in COMMANDS.items()}
    tyro.extras.subcommand_cli_from_dict(listing, description=DESCRIPTION, args=args, prog="ludic")


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

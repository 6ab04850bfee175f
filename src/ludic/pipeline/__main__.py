"""`python -m ludic.pipeline actor|learner [--help]`: the two pipeline processes (the same
configs as `ludic actor` / `ludic learner`)."""

from __future__ import annotations

import logging
import sys

import tyro

from ludic.pipeline.config import ActorConfig, LearnerConfig


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    if len(sys.argv) < 2 or sys.argv[1] not in ("actor", "learner"):
        sys.exit("usage: python -m ludic.pipeline {actor|learner} [--help]")
    command, args = sys.argv[1], sys.argv[2:]
    from ludic.pipeline.commands import run_actor, run_learner

    if command == "actor":
        run_actor(tyro.cli(ActorConfig, args=args, prog="ludic actor"))
    else:
        run_learner(tyro.cli(LearnerConfig, args=args, prog="ludic learner"))


if __name__ == "__main__":
    main()

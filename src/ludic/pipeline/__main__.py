"""`python -m ludic.pipeline actor|learner [--help]`: the two pipeline processes (the same
commands as `ludic actor` / `ludic learner`)."""

from __future__ import annotations

import sys

from ludic import cli


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("actor", "learner"):
        sys.exit("usage: python -m ludic.pipeline {actor|learner} [--help]")
    cli.main(sys.argv[1:], report_refusals=True)  # refusals as `ludic` reports them


if __name__ == "__main__":
    main()

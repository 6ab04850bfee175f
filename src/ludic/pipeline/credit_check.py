"""Which preset assigned a pipeline sample's credit, and the learner's check that it matches.

The actor assigns credit (GRPO baselines, RLOO, GiGPO anchors...) before samples leave it; the
learner runs only the loss. `credit_record` is what the actor stamps into every sample's meta
under `CREDIT_KEY`: its `--algorithm` and the flags that change credit (`--gigpo.*`).
`CreditCheck` refuses, on the first sample that shows it, a learner whose `--algorithm` differs
from the actor's (or two actors on one stream that assign credit differently), naming both
sides and the fix. Samples from actors older than the record get one notice, not an error.
It does not build presets or read Redis.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ludic.recipes.algorithms import GiGPOOptions
from ludic.rollouts.samples import SAWItem
from ludic.types import JSON

logger = logging.getLogger(__name__)
CREDIT_KEY = "credit"


class CreditMismatchError(ValueError):
    """Samples on the stream were credited by another preset than the learner trains."""


def credit_record(algorithm: str, gigpo: GiGPOOptions | None = None) -> JSON:
    """What the actor stamps into each sample: `{"algorithm": name, "flags": {...}}`, the
    flags being the `--gigpo.*` knobs for gigpo (empty for the other presets)."""
    flags: dict[str, Any] = {}
    if algorithm == "gigpo":
        flags = {f"gigpo.{k}": v for k, v in dataclasses.asdict(gigpo or GiGPOOptions()).items()}
    return {"algorithm": algorithm, "flags": flags}


class CreditCheck:
    """Checks each sample's credit record against the learner's `--algorithm`.

    Raises `CreditMismatchError` on the first sample credited by another preset, or credited
    with other flags than the first recorded sample (two actors disagreeing). A sample without
    a record (an actor older than the record) is accepted; the first one logs one notice."""

    def __init__(self, algorithm: str) -> None:
        self.algorithm = algorithm
        self._first: tuple[JSON, str] | None = None  # (record, actor) of the first recorded
        self._noticed = False

    def __call__(self, item: SAWItem) -> None:
        record = item.meta.get(CREDIT_KEY)
        actor = str(item.meta.get("actor_id", "?"))
        if not isinstance(record, dict):
            self._notice_unrecorded(actor)
            return
        if record.get("algorithm") != self.algorithm:
            raise CreditMismatchError(
                f"actor {actor!r} assigned credit with --algorithm {record.get('algorithm')} "
                f"but this learner trains --algorithm {self.algorithm}: the loss would run on "
                "the other preset's advantages. Restart the learner with --algorithm "
                f"{record.get('algorithm')}, or the actors with --algorithm {self.algorithm} "
                "and a new --stream (samples already queued carry the old credit)"
            )
        if self._first is None:
            self._first = (record, actor)
        elif record != self._first[0]:
            first, first_actor = self._first
            raise CreditMismatchError(
                f"actors on this stream assign credit differently: {first_actor!r} with "
                f"{_flags_line(first, record)}, {actor!r} with {_flags_line(record, first)}: "
                "run every actor "
                "of a stream with the same --algorithm and --gigpo.* flags"
            )

    def _notice_unrecorded(self, actor: str) -> None:
        if self._noticed:
            return
        self._noticed = True
        logger.warning(
            "samples from actor %r do not record which --algorithm assigned their credit (an "
            "older ludic actor): this learner cannot check it matches its --algorithm %s",
            actor,
            self.algorithm,
        )


def _flags_line(record: JSON, other: JSON) -> str:
    """`record`'s --algorithm and the flags whose value differs from `other`'s."""
    flags, other_flags = record.get("flags") or {}, other.get("flags") or {}
    words = [f"--algorithm {record.get('algorithm')}"]
    words += [f"--{k} {v}" for k, v in sorted(flags.items()) if other_flags.get(k) != v]
    return " ".join(words)

"""Which preset assigned a pipeline sample's credit, and the learner's check that it matches.

The actor assigns credit (GRPO baselines, RLOO, GiGPO anchors...) before samples leave it; the
learner runs only the loss. `credit_record` is what the actor stamps into every sample's meta
under `CREDIT_KEY`: its `--algorithm`, the flags that change credit (`--gigpo.*`,
`--split-over-turns` when on) and, for a preset whose loss divides by it (dr_grpo), the
`--max-tokens` the samples were generated with.
`CreditCheck` refuses, on the first sample that shows it, a learner whose `--algorithm` or
dr_grpo `--max-tokens` differs from the actor's (or two actors on one stream that record
different settings), naming both sides and the fix, and logs the settings of the first recorded
sample (the `--gigpo.*` knobs the learner trains under are the actors'). That first record
travels in the learner's checkpoints (`state_dict`), so a resumed learner also refuses samples
recorded with other settings than those it trained on before the restart, as `ludic train
--resume` refuses other flags. Samples from actors older than the record, or than its
`--max-tokens`, get one notice, not an error. Under torchrun each rank checks the samples it
reads, and once each batch is read, before the step trains on it, the ranks share their first
records and held notices (`say_held`, the learner's batch source's `check_ranks`, which the
Trainer calls on every rank): every rank refuses alike two first records that differ (actors
whose samples reached only different ranks), and rank 0 says each notice once, those only
another rank saw too. It does not build
presets or read Redis.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from ludic.recipes.algorithms import GiGPOOptions
from ludic.rollouts.samples import SAWItem
from ludic.types import JSON

logger = logging.getLogger(__name__)
CREDIT_KEY = "credit"
MAX_TOKENS = "max_tokens"  # the record's key of --max-tokens
MAX_TOKENS_PRESETS = frozenset({"dr_grpo"})
"""Presets whose loss divides by the generation budget (`--max-tokens`)."""
SPLIT_OVER_TURNS = "split_over_turns"  # the record's key of --split-over-turns (when on)
_RECORD = "record"  # the notice of the first record's settings
Held = dict[str, tuple[int, str]]
"""A rank's notices not said yet, by kind: (logging level, line)."""
First = tuple[JSON, str]
"""The first recorded sample a rank checked: (its credit record, its actor)."""


class CreditMismatchError(ValueError):
    """Samples on the stream were credited by another preset than the learner trains."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RankCredit:
    """What each learner rank shares with the others once it has read a batch (`say_held`)."""

    held: Held
    """The notices it holds, not said yet."""
    first: First | None
    """Its first recorded sample (None before one)."""


def credit_record(
    algorithm: str,
    gigpo: GiGPOOptions | None = None,
    *,
    max_tokens: int | None = None,
    split_over_turns: bool = False,
) -> JSON:
    """What the actor stamps into each sample: `{"algorithm": name, "flags": {...}}`, the
    flags being the `--gigpo.*` knobs for gigpo, `max_tokens` for a preset whose loss
    divides by it and `split_over_turns` when on (off, it is left out: the record of an actor
    older than the flag, which never split, stays the same), else empty."""
    flags: dict[str, Any] = {}
    if algorithm == "gigpo":
        flags = {f"gigpo.{k}": v for k, v in dataclasses.asdict(gigpo or GiGPOOptions()).items()}
    if algorithm in MAX_TOKENS_PRESETS:
        flags[MAX_TOKENS] = max_tokens
    if split_over_turns:
        flags[SPLIT_OVER_TURNS] = True
    return {"algorithm": algorithm, "flags": flags}


class CreditCheck:
    """Checks each sample's credit record against the learner's `--algorithm` and, for a
    preset whose loss divides by it, its `--max-tokens` (`max_tokens`).

    Raises `CreditMismatchError` on the first sample credited by another preset, generated
    with another dr_grpo `--max-tokens`, or recorded with other flags than the first recorded
    sample (two actors disagreeing; under torchrun, also another rank's first, at `say_held`).
    The first recorded sample's settings are logged once. A sample without a record (an actor
    older than the record) is accepted; the first one logs one notice, as does the first
    dr_grpo record without `--max-tokens`. `quiet` (a learner rank other than 0): hold each
    notice instead of logging it, until `say_held`, which every rank calls together; rank 0
    then says, once, those it has not said itself, so a notice that only one rank's samples
    show still reaches the user."""

    def __init__(
        self, algorithm: str, *, max_tokens: int | None = None, quiet: bool = False
    ) -> None:
        self.algorithm = algorithm
        self.max_tokens = max_tokens
        self.quiet = quiet
        self._first: First | None = None
        self._resumed = False  # whether `_first` came from a checkpoint
        self._noticed: set[str] = set()  # kinds said, held, or said by rank 0 (`say_held`)
        self._held: Held = {}

    def state_dict(self) -> JSON | None:
        """The first recorded sample's record and actor (None before one), for a checkpoint."""
        if self._first is None:
            return None
        record, actor = self._first
        return {"record": record, "actor": actor}

    def load_state_dict(self, state: JSON) -> None:
        """Check the samples of a resumed run against the record its checkpoint trained on."""
        self._first = (dict(state["record"]), str(state["actor"]))
        self._resumed = True

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
        if self.algorithm in MAX_TOKENS_PRESETS:
            self._check_max_tokens(record, actor)
        if self._first is None:
            self._first = (record, actor)
            self._notice_once(
                _RECORD,
                logging.INFO,
                "samples from actor %r: credit assigned with %s",
                actor,
                _flags_line(record, {}) or "--algorithm ?",
            )
        elif record != self._first[0] and self._resumed:
            first, first_actor = self._first
            raise CreditMismatchError(
                f"this learner resumed a checkpoint trained on samples of actor {first_actor!r} "
                f"credited with {_flags_line(first, record)}, but actor {actor!r} credits with "
                f"{_flags_line(record, first)}: the run would mix two credit assignments. "
                "Restart the actors with the checkpoint's flags, or train the new ones in a new "
                "run (another --out-dir)"
            )
        elif record != self._first[0]:
            raise _actors_differ(self._first, (record, actor))

    def _check_max_tokens(self, record: JSON, actor: str) -> None:
        flags = record.get("flags") or {}
        if MAX_TOKENS not in flags:
            self._notice_once(
                MAX_TOKENS,
                logging.WARNING,
                "samples from actor %r do not record the --max-tokens they were generated with "
                "(an older ludic actor): this learner cannot check that %s's loss normaliser, "
                "its --max-tokens %s, is the actors' generation budget",
                actor,
                self.algorithm,
                self.max_tokens,
            )
            return
        if flags[MAX_TOKENS] != self.max_tokens:
            raise CreditMismatchError(
                f"actor {actor!r} generated with --max-tokens {flags[MAX_TOKENS]} but this "
                f"learner trains --algorithm {self.algorithm} with --max-tokens "
                f"{self.max_tokens}: its loss divides by the generation budget, so every "
                f"gradient would be scaled by {flags[MAX_TOKENS]}/{self.max_tokens} of what "
                f"the actors' budget gives. Restart the learner with --max-tokens "
                f"{flags[MAX_TOKENS]}, or the actors with --max-tokens {self.max_tokens} and a "
                "new --stream (samples already queued carry the old budget)"
            )

    def _notice_unrecorded(self, actor: str) -> None:
        self._notice_once(
            CREDIT_KEY,
            logging.WARNING,
            "samples from actor %r do not record which --algorithm assigned their credit (an "
            "older ludic actor): this learner cannot check it matches its --algorithm %s",
            actor,
            self.algorithm,
        )

    def say_held(self, all_gather: Callable[[RankCredit], list[RankCredit]]) -> None:
        """Called by every rank together once each batch is read, before the step trains on
        it (`all_gather` is the ranks' all-gather of an object, in rank order): it gathers each rank's held notices and first
        record. Rank 0 (the one not `quiet`) logs each kind of notice it has not said itself,
        from the lowest rank that holds it, naming that rank; every rank then holds no notice
        of a kind said, so none is said twice. Then, where two ranks' first records differ
        (actors whose samples reached only different ranks), every rank raises the same
        `CreditMismatchError`, naming both records and both ranks, so none trains on the mixed
        credit and none waits alone in a later collective."""
        held, self._held = self._held, {}
        ranks = all_gather(RankCredit(held=held, first=self._first))
        said_now: set[str] = set()
        for rank, shared in enumerate(ranks):
            for what, (level, line) in shared.held.items():
                if what in said_now or (not self.quiet and what in self._noticed):
                    continue
                said_now.add(what)
                if not self.quiet:
                    logger.log(level, "learner rank %d: %s", rank, line)
        self._noticed |= said_now
        recorded = [(rank, shared.first) for rank, shared in enumerate(ranks) if shared.first]
        for rank, first in recorded[1:]:  # each against the lowest rank's, on every rank alike
            lowest_rank, lowest = recorded[0]
            if first[0] != lowest[0]:
                raise _actors_differ(lowest, first, ranks=(lowest_rank, rank))

    def _notice_once(self, what: str, level: int, message: str, *args: Any) -> None:
        if what in self._noticed:
            return
        self._noticed.add(what)
        if self.quiet:  # rank 0 says it, unless it says its own (`say_held`)
            self._held[what] = (level, message % args)
        else:
            logger.log(level, message, *args)


def _actors_differ(
    first: First, other: First, *, ranks: tuple[int, int] | None = None
) -> CreditMismatchError:
    """The refusal of two actors on one stream whose records differ; `ranks`: the learner
    ranks that read each (under torchrun, where each rank checked only its own)."""
    (record, actor), (other_record, other_actor) = first, other
    read = ("", "") if ranks is None else tuple(f" (read by learner rank {r})" for r in ranks)
    return CreditMismatchError(
        f"actors on this stream assign credit differently: {actor!r}{read[0]} with "
        f"{_flags_line(record, other_record)}, {other_actor!r}{read[1]} with "
        f"{_flags_line(other_record, record)}: run every actor of a stream with the same "
        "--algorithm and --gigpo.* flags"
    )


def _flags_line(record: JSON, other: JSON) -> str:
    """`record`'s --algorithm and the flags whose value differs from `other`'s, as flags."""
    flags, other_flags = record.get("flags") or {}, other.get("flags") or {}
    words = [f"--algorithm {record.get('algorithm')}"]
    words += [
        f"--{k.replace('_', '-')} {v}"
        for k, v in sorted(flags.items())
        if k not in other_flags or other_flags[k] != v
    ]
    return " ".join(words)

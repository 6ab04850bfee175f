"""Which run a pipeline sample belongs to, and the learner's check that it is its own.

Actors of one run share a run id (`run_id_for` of the settings that define what their samples
mean: env, credit, sampling, model), stamped into every sample's meta under `RUN_KEY`; an actor
restarted with the same flags keeps it, one started with other flags (another --env, --algorithm,
--temperature...) is another run. `RunCheck` is the learner's side: the first stamped sample it
reads (or the run its checkpoint records) names the run it trains, and a sample of another run
is refused as foreign, with a message naming both runs and the fix (one stream per run), for the
learner to dead-letter. A sample without a run id (an actor older than run ids, or a
`PipelineActor` given none) is trained, after one notice: its run cannot be told. Under torchrun
each rank pins the run of the first sample it reads. It does no I/O.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping

from ludic.errors import LudicUsageError
from ludic.rollouts.samples import SAWItem
from ludic.types import JSON

logger = logging.getLogger(__name__)
RUN_KEY = "run_id"
"""The sample meta key of the run id the actor stamps."""
MAX_RUN_ID = 128


def run_id_for(settings: Mapping[str, object]) -> str:
    """A stable id of the run `settings` define (JSON data: the flags that give samples their
    meaning, not per-actor ones such as an actor id, a seed or a server URL): the same settings
    give the same id in every process and on every restart."""
    canonical = json.dumps(dict(settings), sort_keys=True, separators=(",", ":"), default=str)
    return "run-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def check_run_id(run_id: str | None, *, flag: str = "--run-id") -> None:
    """Refuse a run id that is empty, longer than `MAX_RUN_ID` or not printable ASCII without
    spaces (it is typed on command lines and shown in logs), naming `flag`."""
    if run_id is None:
        return
    if not 0 < len(run_id) <= MAX_RUN_ID or not all("!" <= c <= "~" for c in run_id):
        raise LudicUsageError(
            f"{flag} must be 1-{MAX_RUN_ID} printable ASCII characters without spaces, got "
            f"{run_id!r}: pass the id the run's actors and learner log (run-<16 hex digits>)"
        )


def foreign_note(count: int) -> str:
    """What a learner's waiting or closing line adds when `count` samples it read were foreign."""
    if not count:
        return ""
    return f"; {count} read came from another run and were dead-lettered (see the error above)"


class RunCheck:
    """Tells the samples of the learner's run from other runs' on its stream.

    `foreign(item, entry_id)` returns None for a sample of this learner's run (the first stamped
    one pins it, logged once) or without a run id (one notice), else the reason to dead-letter
    it; each foreign run is described at length once, by `describe_foreign`. The pinned run
    travels in the learner's checkpoints (`state_dict`), so a resumed learner keeps it. `run`
    pins the run from the start (`--run-id`), over the checkpoint's. `who` names the learner
    in its lines (under torchrun, its rank: each rank pins and says it alone)."""

    def __init__(self, *, stream: str, run: str | None = None, who: str = "this learner") -> None:
        self.stream = stream
        self.who = who
        self.run: str | None = run
        self.given = run  # the run --run-id names, kept over a checkpoint's
        self.first_actor = "?"
        self.resumed = False  # whether `run` came from a checkpoint
        self._noticed_unstamped = False
        self._described: set[str] = set()

    def state_dict(self) -> JSON | None:
        if self.run is None:
            return None
        return {"id": self.run, "actor": self.first_actor}

    def load_state_dict(self, state: JSON | None) -> None:
        if state is None:  # a checkpoint from before run ids: the first stamped sample pins
            return
        if self.given is not None:
            if str(state["id"]) != self.given:
                logger.warning(
                    "the checkpoint's learner trained run %s; --run-id switches it to run %s "
                    "from this step on (samples of run %s are dead-lettered from now)",
                    state["id"],
                    self.given,
                    state["id"],
                )
            return
        self.run, self.first_actor = str(state["id"]), str(state["actor"])
        self.resumed = True

    def foreign(self, item: SAWItem, entry_id: str) -> str | None:
        run = item.meta.get(RUN_KEY)
        actor = str(item.meta.get("actor_id", "?"))
        if run is None:
            self._notice_unstamped(actor, entry_id)
            return None
        run = str(run)
        if self.run is None:
            self.run, self.first_actor = run, actor
            logger.info(
                "%s trains run %s (its first sample came from actor %r); samples of other runs "
                "on stream %r are dead-lettered",
                self.who,
                run,
                actor,
                self.stream,
            )
            return None
        if run == self.run:
            return None
        return f"from run {run} (actor {actor!r}); this learner trains run {self.run}"

    def describe_foreign(self, item: SAWItem, entry_id: str) -> str | None:
        """The full account of a foreign sample's run, the first time that run shows (else
        None): both runs, where this learner's came from, and what to do."""
        run = str(item.meta.get(RUN_KEY))
        if run in self._described:
            return None
        self._described.add(run)
        actor = str(item.meta.get("actor_id", "?"))
        since = (
            "as --run-id says"
            if self.given is not None
            else "as its checkpoint records"
            if self.resumed
            else f"since its first sample, from actor {self.first_actor!r}"
        )
        return (
            f"stream {self.stream!r} carries samples of two runs: entry {entry_id} comes from "
            f"run {run} (actor {actor!r}), but {self.who} trains run {self.run} ({since}). An "
            "actor started with other flags than the run's (--env, --env-kwargs, --algorithm, "
            "--temperature, --max-tokens, --model, ...) is another run. Its samples are "
            f"dead-lettered to {self.stream + ':dead'!r} (kept there, never trained) and counted "
            f"as pipeline/foreign_run. Give each run its own stream: restart run {run}'s actors "
            "with another --stream (and give them a learner of their own). If this learner "
            f"should train run {run} instead, stop it and start a new one (another --out-dir) "
            f"with those actors on a fresh --stream, or restart it with --run-id {run}. Actors "
            f"of run {self.run} restarted with flags changed on purpose keep its id with "
            f"`ludic actor --run-id {self.run}`"
        )

    def _notice_unstamped(self, actor: str, entry_id: str) -> None:
        if self._noticed_unstamped:
            return
        self._noticed_unstamped = True
        logger.info(  # a supported setup (run_id=None), not a fault: no warning
            "entry %s (actor %r) carries no run id (an actor older than run ids, or a "
            "PipelineActor given no run_id): it is trained, but %s cannot tell whether it "
            "belongs to its run; samples of other runs are refused only where they carry one",
            entry_id,
            actor,
            self.who,
        )

"""Which trainer holds a server's weight-sync group, and which groups it replaced.

Each `/ludic/weights/init` mints a group id (returned to the trainer, which carries it on
`/start`, `/finish` and `/close`, and asks `/status?group=` about it). A join by another
trainer (another `trainer.id`, or one that does not say) replaces the held group: the server
logs one line naming both trainers and remembers the replaced group, so that its trainer's
next push or close is refused (409, `GroupReplaced`, naming the trainer that joined) instead
of freeing the newer group or rejoining silently. A rejoin by the same trainer (a fresh group
after a failed push) replaces nothing. Shared by the embedded server's receiver and the vLLM
extension's routes; it does no I/O and holds no group itself.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass

from pydantic import BaseModel, Field

from ludic.inference.http.weight_outcomes import WeightSyncError

# What a refusal says, and what a trainer looks for to stop instead of rejoining.
REPLACED = "replaced by another trainer"
_KEEP = 64  # replaced groups remembered (oldest forgotten first)


def group_named(value: object, route: str) -> str | None:
    """The group id a weight-sync request names (`value`: its body's "group"); None when it
    names none (an older trainer). ValueError (a 400) for anything but a string: a list or an
    object is no id this server minted, and must not pass for one."""
    if value is None or isinstance(value, str):
        return value
    raise ValueError(
        f'{route}: "group" must be the group id string /ludic/weights/init returned, got '
        f"{type(value).__name__}"
    )


def group_in_body(raw: bytes, route: str) -> str | None:
    """The group id a `/finish` or `/close` body carries: None for no body (an older trainer
    sends none) or an object without one. ValueError (a 400) for a body that is not a JSON
    object (`[]`, `"x"`, `null`): read as no group, it closed or finished whatever group the
    server held."""
    if not raw.strip():
        return None
    try:
        body = json.loads(raw)
    except ValueError as e:  # also a body that is not UTF-8
        raise ValueError(
            f"{route}: the body is not JSON ({e}); send a JSON object such as "
            '{"group": "<id from /ludic/weights/init>"}, or no body'
        ) from None
    if not isinstance(body, dict):
        raise ValueError(
            f"{route}: the body must be a JSON object such as "
            f'{{"group": "<id from /ludic/weights/init>"}} (or no body), got '
            f"{'null' if body is None else type(body).__name__}; nothing was changed"
        )
    return group_named(body.get("group"), route)


class TrainerInfo(BaseModel):
    """Who is joining: an id per publisher (a rejoin by the same one replaces no one), and
    where it runs, for the messages."""

    id: str = Field(min_length=1, max_length=200)
    host: str = Field(default="", max_length=300)
    pid: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Holder:
    """A joined group: its id, the trainer store it was built on and the trainer (if said)."""

    group: str
    store: str
    trainer: TrainerInfo | None
    since: float

    def describe(self) -> str:
        who = self.trainer
        if who is None:
            return f"a trainer with its store at {self.store} (it did not say its host or pid)"
        pid = "" if who.pid is None else f", pid {who.pid}"
        return f"the trainer on {who.host or 'an unnamed host'}{pid} (store at {self.store})"


def _same_trainer(a: TrainerInfo | None, b: TrainerInfo | None) -> bool:
    """Both said who they are, and are the same publisher (a trainer that does not say
    cannot be told from another)."""
    return a is not None and b is not None and a.id == b.id


class GroupReplaced(WeightSyncError):
    """A push or close for a group another trainer's join replaced (409)."""


class Tenure:
    """The held group (`current`) and the groups replaced by another trainer's join."""

    def __init__(self) -> None:
        self.current: Holder | None = None
        self._replaced: OrderedDict[str, Holder] = OrderedDict()  # old group -> who took it

    def begin(self, store: str, trainer: TrainerInfo | None) -> tuple[Holder, str | None]:
        """A new group for `trainer`; with a line to log when it replaces another trainer."""
        new = Holder(group=uuid.uuid4().hex, store=store, trainer=trainer, since=time.time())
        old, self.current = self.current, new
        if old is None or _same_trainer(old.trainer, trainer):
            return new, None
        self._replaced[old.group] = new
        while len(self._replaced) > _KEEP:
            self._replaced.popitem(last=False)
        return new, (
            f"weight sync: {new.describe()} joined and replaced the group of {old.describe()}; "
            "that trainer's pushes and close are refused from now on"
        )

    def end(self, group: str | None = None) -> None:
        """The held group is gone (closed, left, failed); with `group`, only if it is held."""
        if group is None or (self.current is not None and self.current.group == group):
            self.current = None

    def replaced_by(self, group: str | None) -> str | None:
        """Why `group` was refused, when another trainer's join replaced it."""
        by = None if group is None else self._replaced.get(group)
        if by is None:
            return None
        at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(by.since))
        return (
            f"this trainer's weight-sync group was {REPLACED}: {by.describe()} joined this "
            f"server at {at} and serves its pushes now (not this trainer's weights). Stop one "
            "of the two trainers: with `ludic train`/`ludic learner`, stop one run (a restarted "
            "run is a new trainer and takes the server back); from code, "
            "BroadcastPolicyPublisher(take_over=True) takes it back at every push"
        )

    def report(self, group: str | None) -> dict[str, str | None]:
        """For the status: the held group and its trainer (when one is held) and, asked about
        `group`, whether another trainer replaced it (`replaced_by`: the refusal it gets)."""
        held = self.current
        report: dict[str, str | None] = {}
        if held is not None:
            report.update(group=held.group, trainer=held.describe())
        if group is not None:
            report["replaced_by"] = self.replaced_by(group)
        return report

    def check(self, group: str | None) -> None:
        """Refuse (409) a request that names a group other than the one held: `GroupReplaced`
        when another trainer replaced it. No `group` (an older trainer): not checked."""
        if group is None or (self.current is not None and self.current.group == group):
            return
        replaced = self.replaced_by(group)
        if replaced is not None:
            raise GroupReplaced(replaced)
        held = "no group" if self.current is None else f"the group of {self.current.describe()}"
        raise WeightSyncError(
            f"no communicator for weight-sync group {group}: this server holds {held} "
            "(it restarted, or that group was closed); POST /ludic/weights/init to rejoin"
        )

"""`RolloutBatchSource`: the synchronous source. Each batch runs fresh episodes with the current
policy (requests -> engine -> credit -> samples -> filters, via `generate_batch`), so the
Trainer waits for rollouts. To overlap rollouts and training, wrap it in `PrefetchBatchSource`
(one process, one batch ahead) or use a pipeline source (`ludic.pipeline`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from ludic._aio import maybe_await
from ludic._resumed_log import BATCH_INDEX
from ludic.rollouts import (
    CreditAssigner,
    RequestStrategy,
    Retokenizer,
    RolloutEngine,
    RolloutRequest,
    SampleFilter,
    SampleMode,
    SeedSequencer,
    SnapshotPolicy,
    distinct_request_ids,
    generate_batch,
)
from ludic.training.batching.types import SAWBatch
from ludic.types import JSON

logger = logging.getLogger(__name__)

RequestsFn = Callable[[], Sequence[RolloutRequest] | Awaitable[Sequence[RolloutRequest]]]


class RolloutBatchSource:
    """Generates each batch on demand.

    - `requests_fn()` gives the logical requests of the next batch (sync or async);
      `strategy` expands them (e.g. `GRPORequestStrategy(group_size=8)`).
    - `seed_sequencer` fills unset env / sampling seeds from the batch index, so a run (and a
      resumed run) replays the same seeds; the batch index is the checkpointed state. Without
      one, a strategy derives the seeds of an unseeded request from its `request_id`, so the
      same request objects every batch (`requests_fn=lambda: prompts`) replay the same
      problems and sampling seeds every step: logged once as a warning naming the fix.
    - The same request more than once in a batch (`requests_fn=lambda: [problem] * 4`) is that
      many problems: each repeat gets its own `request_id` (`<id>@<position>`), since a strategy
      groups by request id and would otherwise put every copy's episodes, each copy with its
      own seeds, in one baseline group.
    - `credit_assigner`, `filters`, `sample_mode`, `snapshot_policy`, `retokenizer` go to
      `generate_batch`.

    Each rollout's and sample's meta records `batch_index`, so the engine's `jsonl_log` and
    `ludic.recipes.SampleLog` can drop what a run resumed from an earlier batch replays.
    """

    def __init__(
        self,
        *,
        engine: RolloutEngine,
        requests_fn: RequestsFn,
        credit_assigner: CreditAssigner,
        filters: Sequence[SampleFilter] = (),
        strategy: RequestStrategy | None = None,
        seed_sequencer: SeedSequencer | None = None,
        sample_mode: SampleMode = "turn",
        snapshot_policy: SnapshotPolicy = "share",
        retokenizer: Retokenizer | None = None,
    ) -> None:
        self.engine = engine
        self.requests_fn = requests_fn
        self.credit_assigner = credit_assigner
        self.filters = tuple(filters)
        self.strategy = strategy
        self.seed_sequencer = seed_sequencer
        self.sample_mode: SampleMode = sample_mode
        self.snapshot_policy: SnapshotPolicy = snapshot_policy
        self.retokenizer = retokenizer
        self.batch_index = 0
        self._unseeded_ids: set[str] = set()  # the previous batch's unseeded request ids
        self._warned_replay = False

    async def next_batch(self) -> SAWBatch:
        requests = list(await maybe_await(self.requests_fn()))
        if self.seed_sequencer is not None:
            requests = self.seed_sequencer.seed_requests(requests, self.batch_index)
        else:
            self._warn_on_replay(requests)
        requests = distinct_request_ids(requests)
        requests = [replace(r, meta={**r.meta, BATCH_INDEX: self.batch_index}) for r in requests]
        result = await generate_batch(
            self.engine,
            requests,
            self.credit_assigner,
            filters=self.filters,
            strategy=self.strategy,
            sample_mode=self.sample_mode,
            snapshot_policy=self.snapshot_policy,
            retokenizer=self.retokenizer,
        )
        for item in result.samples:
            item.meta[BATCH_INDEX] = self.batch_index
        self.batch_index += 1
        stats = {k: float(v) for k, v in result.stats.to_dict().items()}
        return SAWBatch(items=result.samples, rollouts=result.rollouts, stats=stats)

    def _warn_on_replay(self, requests: Sequence[RolloutRequest]) -> None:
        """Warn once when an unseeded request of the previous batch comes back: the strategy
        derives its env and sampling seeds from its id, so the batch repeats the last one's
        problems and seeds (a silent loss of data diversity)."""
        if self.strategy is None or self._warned_replay:
            return
        unseeded = {
            r.request_id for r in requests if r.env_seed is None and r.sampling_seed is None
        }
        repeated = sorted(unseeded & self._unseeded_ids)
        self._unseeded_ids = unseeded
        if repeated:
            self._warned_replay = True
            others = f" (and {len(repeated) - 1} more)" if len(repeated) > 1 else ""
            logger.warning(
                "RolloutBatchSource: batch %d reuses unseeded request %r%s from the batch "
                "before, and %s derives seeds from the request id, so every batch plays the "
                "same problems with the same sampling seeds; pass "
                "seed_sequencer=SeedSequencer(run_seed=...) or give each batch new requests",
                self.batch_index,
                repeated[0],
                others,
                type(self.strategy).__name__,
            )

    def state_dict(self) -> JSON:
        return {"batch_index": self.batch_index}

    def load_state_dict(self, state: JSON) -> None:
        self.batch_index = int(state.get("batch_index", 0))

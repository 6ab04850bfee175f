"""The Evaluator seam and `EngineEvaluator`: a rollout engine, a request builder and reducers.

An evaluator is what a training loop calls between steps: `await evaluator.evaluate()`. It
keeps no policy of its own (the engine's ChatClient serves whatever weights were last pushed)
and never touches the trainer beyond reading its `step` for labelling.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from ludic.eval.core import EvalResult, RolloutRunner, run_eval
from ludic.eval.records import SuccessFn, reward_success
from ludic.eval.reducers import Reducer
from ludic.rollouts import RolloutRequest

RequestsFn = Callable[[], Sequence[RolloutRequest]]


@runtime_checkable
class Evaluator(Protocol):
    """Runs one evaluation and returns its records and metrics."""

    async def evaluate(self, *, tag: str | None = None) -> EvalResult: ...


class EngineEvaluator:
    """Evaluate with a rollout engine on the requests `requests_fn()` builds each time.

    - `reducers`: metrics to compute (None: `default_reducers`, pass@k included when every
      problem has several samples).
    - `out_dir`: when set, each evaluation writes its records to `out_dir / tag`.
    - Called as a function (`await evaluator(trainer)`), it returns only the metrics, which is
      the shape a Trainer eval hook expects; the tag is then `step-<trainer.step>`.
    """

    def __init__(
        self,
        engine: RolloutRunner,
        requests_fn: RequestsFn,
        *,
        reducers: Mapping[str, Reducer] | None = None,
        success_fn: SuccessFn = reward_success,
        progress: bool = False,
        out_dir: str | Path | None = None,
    ) -> None:
        self.engine = engine
        self.requests_fn = requests_fn
        self.reducers = reducers
        self.success_fn = success_fn
        self.progress = progress
        self.out_dir = None if out_dir is None else Path(out_dir)
        self.num_evals = 0
        self.last_result: EvalResult | None = None

    async def evaluate(self, *, tag: str | None = None) -> EvalResult:
        requests = list(self.requests_fn())
        if not requests:
            raise ValueError(
                "EngineEvaluator.requests_fn returned no requests; build at least one "
                "RolloutRequest (see ludic.eval.make_eval_requests)"
            )
        tag = tag or f"eval-{self.num_evals:04d}"
        result = await run_eval(
            self.engine,
            requests,
            self.reducers,
            success_fn=self.success_fn,
            progress=self.progress,
            out_dir=None if self.out_dir is None else self.out_dir / tag,
        )
        self.num_evals += 1
        self.last_result = result
        return result

    async def __call__(self, trainer: object | None = None) -> dict[str, float]:
        step = getattr(trainer, "step", None)
        tag = None if step is None else f"step-{int(step):06d}"
        return (await self.evaluate(tag=tag)).metrics

"""First-class evaluation: run episodes, record each episode and turn, reduce to metrics
(means, outcome rates, pass@k, mean@k). Depends on rollouts, never on training; the command
module (`ludic eval`) is imported on demand: `from ludic.eval.command import ...`."""

from ludic.eval.core import EvalResult, RolloutRunner, make_eval_requests, run_eval, summarise
from ludic.eval.evaluator import EngineEvaluator, Evaluator, RequestsFn
from ludic.eval.progress import EvalProgress
from ludic.eval.records import (
    OUTCOME_KEYS,
    EpisodeRecord,
    StepRecord,
    SuccessFn,
    episode_outcome,
    episode_record,
    read_episode_records,
    reward_success,
    step_records,
    write_records_jsonl,
)
from ludic.eval.reducers import (
    Count,
    Mean,
    MeanAtK,
    PassAtK,
    Rates,
    Reducer,
    default_reducers,
    group_episodes,
    lookup,
    pass_at_k,
    reduce_metrics,
)
from ludic.eval.summary import print_summary, summary_table

__all__ = [
    "OUTCOME_KEYS",
    "Count",
    "EngineEvaluator",
    "EpisodeRecord",
    "EvalProgress",
    "EvalResult",
    "Evaluator",
    "Mean",
    "MeanAtK",
    "PassAtK",
    "Rates",
    "Reducer",
    "RequestsFn",
    "RolloutRunner",
    "StepRecord",
    "SuccessFn",
    "default_reducers",
    "episode_outcome",
    "episode_record",
    "group_episodes",
    "lookup",
    "make_eval_requests",
    "pass_at_k",
    "print_summary",
    "read_episode_records",
    "reduce_metrics",
    "reward_success",
    "run_eval",
    "step_records",
    "summarise",
    "summary_table",
    "write_records_jsonl",
]

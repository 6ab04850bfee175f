"""`PrefetchBatchSource.watch_model` hooks the model it is given last: a Trainer that failed to
start (e.g. its optimizer named another model's parameters) left its hooks on a model the next
Trainer on the same source does not train, and lending then never happened (found in review)."""

from __future__ import annotations

import torch
from training_fakes import ListSource, mixed_items, tiny_llama

from ludic.training import PrefetchBatchSource


def hooks_on(model: torch.nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def test_a_second_model_is_watched_and_the_first_let_go() -> None:
    first, second = tiny_llama(seed=0), tiny_llama(seed=1)
    source = PrefetchBatchSource(ListSource([mixed_items(2)]), lend_idle_threads=2)
    try:
        source.watch_model(first)
        layers = len(first.model.layers)
        assert hooks_on(first) == 2 * layers
        source.watch_model(first)  # the same model again: no second set
        assert hooks_on(first) == 2 * layers
        source.watch_model(second)
        assert (hooks_on(first), hooks_on(second)) == (0, 2 * layers)
    finally:
        source.close()
    assert hooks_on(second) == 0

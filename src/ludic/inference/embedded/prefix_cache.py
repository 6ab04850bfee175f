"""Reuse of finished sequences' KV for prompts that extend them (multi-turn agents).

When an episode's next prompt starts with the previous call's prompt + completion, only the new
suffix needs a forward pass. Entries are whole finished sequences, matched by exact token-id
prefix and evicted least-recently-used under a token budget; the engine clears the cache when
weights change. No block-level sharing between unrelated prompts (vLLM's paged prefix cache).

Legend: L layers, H kv heads, T positions, D head dim.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class CachedPrefix:
    """Token ids and, per layer, their keys and values (each H x T x D)."""

    ids: tuple[int, ...]
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]


class PrefixCache:
    """LRU store of finished sequences' KV, bounded by `max_tokens` in total."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], CachedPrefix] = OrderedDict()
        self._tokens = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def store(self, entry: CachedPrefix) -> None:
        if len(entry.ids) > self.max_tokens or entry.ids in self._entries:
            return
        self._entries[entry.ids] = entry
        self._tokens += len(entry.ids)
        while self._tokens > self.max_tokens:
            _, evicted = self._entries.popitem(last=False)
            self._tokens -= len(evicted.ids)

    def lookup(self, prompt_ids: Sequence[int]) -> CachedPrefix | None:
        """The longest entry that is a strict prefix of `prompt_ids` (at least one new token)."""
        best: CachedPrefix | None = None
        prompt = tuple(prompt_ids)
        for ids, entry in self._entries.items():
            n = len(ids)
            if n < len(prompt) and (best is None or n > len(best.ids)) and prompt[:n] == ids:
                best = entry
        if best is not None:
            self._entries.move_to_end(best.ids)
            self.hits += 1
        return best

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0

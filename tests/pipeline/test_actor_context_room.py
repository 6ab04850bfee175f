"""`ludic actor --max-tokens N` against a server whose model's context (`max_model_len` on its
`/v1/models` card) is at or below N is refused before any episode: every request would be a
400, every episode failed, and `--batches 1` exited 0 (found by the Redis walk)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pipeline_fakes import RedisServer, redis_server

from ludic.cli import main as ludic_main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recipes"))
from test_served_model_routing import models_stub

__all__ = ["redis_server"]


def test_the_actor_refuses_a_budget_past_the_servers_context(redis_server: RedisServer) -> None:
    card = {"id": "tiny", "object": "model", "owned_by": "ludic", "max_model_len": 64}
    refusal = "--max-tokens 128 leaves no room for a prompt"
    with models_stub([card]) as (url, _), pytest.raises(ValueError, match=refusal):
        actor = ["actor", "--env", "tictactoe", "--redis-url", redis_server.url, "--batches", "1"]
        ludic_main([*actor, "--server-url", url, "--max-tokens", "128"])

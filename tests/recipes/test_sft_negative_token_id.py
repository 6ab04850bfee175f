"""`ludic sft` on a rollouts file holding a negative token id (a damaged or hand-edited line)
is refused before training, naming the file, the rollout and the fix: in one of the first
completions it was the tokenizer's OverflowError traceback, further on the collator's refusal
at the first batch, saying another model generated the data."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from ludic.errors import is_refusal
from ludic.models import TinyModelSpec, load_model, tiny_model_dir
from ludic.recipes.configs import SFTConfig
from ludic.recipes.expert import PolicyClient
from ludic.recipes.sft import sft_command
from ludic.recipes.tictactoe import ENV_NAME, PROTOCOL_NAME, expert_policy, rollout_engine
from ludic.rollouts import ComponentSpec, RolloutRequest, SeedSequencer, write_rollouts_jsonl

SPEC = TinyModelSpec(hidden_size=32, intermediate_size=64, num_hidden_layers=1)


@pytest.mark.parametrize("damaged", [0, 1], ids=["first-rollout", "second-rollout"])
def test_a_negative_token_id_is_refused_naming_the_rollout(tmp_path: Path, damaged: int) -> None:
    model = tiny_model_dir(seed=0, spec=SPEC, cache_dir=tmp_path / "models")
    client = PolicyClient(expert_policy(1.0), load_model(model)[1])
    request = RolloutRequest(
        env=ComponentSpec(name=ENV_NAME), protocol=ComponentSpec(name=PROTOCOL_NAME)
    )
    requests = SeedSequencer(run_seed=0).seed_requests([request, request], 0)
    rollouts = asyncio.run(rollout_engine(client).run(requests))
    data = tmp_path / "data.jsonl"
    write_rollouts_jsonl(rollouts, data)
    lines = data.read_text().splitlines()
    record = json.loads(lines[damaged])
    record["steps"][0]["trace"]["completion_token_ids"][0] = -5
    lines[damaged] = json.dumps(record)
    data.write_text("\n".join(lines) + "\n")

    cfg = SFTConfig(data=data, model=str(model), out_dir=tmp_path / "out", steps=1, progress=False)
    with pytest.raises(ValueError) as e:
        sft_command(cfg)
    message = str(e.value)
    assert is_refusal(e.value), message
    assert f"{data}: rollout {record['id']!r} holds token id -5" in message, message
    assert not (tmp_path / "out" / "checkpoints").exists()  # refused before any training

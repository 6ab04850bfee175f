"""The viewer's data: episodes, turns, messages, tool calls, parse errors, snapshots, masks and
weights as training sees them; JSON embedding that no rollout text can break out of."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from viz_fakes import INJECTION, advantage_samples, all_rollouts

from ludic.inference.scripted import IM_END, decode_ids
from ludic.rollouts import write_rollouts_jsonl
from ludic.types import AgentStep, Rollout
from ludic.viz import byte_decoder, embed_json, write_viewer
from ludic.viz.tokens import id_decoder, resolve_decoder
from ludic.viz.view_model import build_view


def by_request(view: list[dict]) -> dict[str, dict]:
    return {ep["request"]: ep for ep in view}


async def test_episodes_turns_and_calls() -> None:
    rollouts = await all_rollouts()
    view = by_request(build_view(rollouts, advantage_samples(rollouts), byte_decoder))
    assert [ep["outcome"] for ep in build_view(rollouts, None, byte_decoder)] == [
        "win", "truncated", "win", "win", "error", "win",
    ]  # fmt: skip

    win = view["req-win"]
    assert (win["reward"], win["num_turns"], win["group"], win["seed"]) == (1.0, 2, "g0", 0)
    first, second = win["turns"]
    assert [m["role"] for m in first["calls"][0]["messages"]] == ["system", "user"]
    assert second["calls"][0]["messages"] == [{"role": "user", "content": "Wrong, go higher."}]
    assert second["env"]["terminated"] and second["env"]["info"] == {"outcome": "win"}

    parse = view["req-parse"]
    bad = parse["turns"][0]
    assert bad["calls"][0]["parse"]["ok"] is False and bad["env"]["parse_error"]
    assert parse["truncated"] and parse["truncation_reason"] == "max_steps"
    assert parse["turns"][1]["env"]["reason"] == "max_steps"

    tool = view["req-tool"]["turns"][0]
    assert [c["target"] for c in tool["calls"]] == ["internal", "env"]
    assert tool["calls"][0]["tool_calls"][0]["name"] == "add"
    assert tool["calls"][0]["tool_results"][0]["content"] == "3"
    assert all(m["role"] != "tool" for m in tool["calls"][1]["messages"])  # shown once

    cut = view["req-cutoff"]["turns"][0]["calls"][0]
    assert cut["finish"] == "length" and cut["incomplete"]

    failed = view["req-failed"]
    assert failed["failed"] and failed["error_type"] == "TypeError" and failed["turns"] == []


async def test_samples_masks_weights_and_snapshots() -> None:
    rollouts = await all_rollouts()
    samples = advantage_samples(rollouts)
    view = build_view(rollouts, samples, byte_decoder)
    shown = [s for ep in view for t in ep["turns"] for s in t["samples"]]
    assert len(shown) == len(samples)
    assert sum(s["m"].count("1") for s in shown) == sum(s.num_action_tokens for s in samples)
    snap = by_request(view)["req-snap"]
    assert snap["turns"][0]["calls"][1]["rewritten"]
    segments = snap["turns"][0]["samples"]
    assert [(s["segment"], s["snapshot"]) for s in segments] == [(0, True), (1, False)]
    for ep in view:
        for turn in ep["turns"]:
            for s in turn["samples"]:
                assert s["weight"] == pytest.approx(ep["reward"] - 0.5)
                assert len(s["t"]) == len(s["ids"]) == len(s["m"])
    # the action tokens decode to each call's completion plus the end marker
    win = by_request(view)["req-win"]["turns"][0]["samples"][0]
    action_ids = [i for i, m in zip(win["ids"], win["m"], strict=True) if m == "1"]
    assert action_ids[-1] == IM_END
    assert decode_ids(action_ids) == "<move>1</move>"
    assert "".join(t for t, m in zip(win["t"], win["m"], strict=True) if m == "1") == (
        "<move>1</move><|im_end|>"
    )


async def test_without_samples_masks_come_from_the_traces() -> None:
    rollouts = await all_rollouts()
    view = build_view(rollouts, None, byte_decoder)
    given = build_view(rollouts, advantage_samples(rollouts), byte_decoder)
    for derived, real in zip(view, given, strict=True):
        assert derived["derived_samples"] and not real["derived_samples"]
        for dt, rt in zip(derived["turns"], real["turns"], strict=True):
            assert [s["m"] for s in dt["samples"]] == [s["m"] for s in rt["samples"]]


async def test_64_bit_seeds_reach_the_page_exactly() -> None:
    # SeedSequencer derives 64-bit episode seeds; a JSON number above 2**53 is rounded by the
    # page's JavaScript (7503306085401639846 showed as 7503306085401640000)
    rollouts = await all_rollouts()
    big = 7503306085401639846
    rollouts[0].meta["env_seed"] = big
    rollouts[0].meta["note"] = {"draw": -big, "small": 2**53 - 1}
    view = build_view(rollouts, None, byte_decoder)
    assert view[0]["seed"] == str(big) and view[1]["seed"] == 1  # small ones stay numbers
    assert view[0]["meta"]["note"] == {"draw": str(-big), "small": 2**53 - 1}


def test_byte_decoder_handles_multibyte_and_specials() -> None:
    ids = [256, *"é!".encode(), 257, 999]
    assert byte_decoder(ids) == ["<|im_start|>", "\\xc3", "é", "!", "<|im_end|>", "[999]"]


async def test_decoder_resolution() -> None:
    rollouts = await all_rollouts()
    assert resolve_decoder(None, rollouts)[1] == "bytes (auto-detected)"
    # traces whose bytes do not spell the completions are not ScriptedClient's
    foreign = [
        Rollout(
            steps=[replace(s, completion="x") if isinstance(s, AgentStep) else s for s in r.steps]
        )
        for r in rollouts
    ]
    assert resolve_decoder(None, foreign)[0] is id_decoder

    class Tok:
        def decode(self, ids: list[int]) -> str:
            return f"<{ids[0]}>"

    decode, _ = resolve_decoder(Tok(), rollouts)
    assert decode([5, 6, 5]) == ["<5>", "<6>", "<5>"]
    with pytest.raises(TypeError, match="decode"):
        resolve_decoder(42, rollouts)  # type: ignore[arg-type]


def test_embedded_json_cannot_close_the_script() -> None:
    data = {"x": INJECTION, "y": "<!-- a & b -->", "z": "\u2028"}
    text = embed_json(data)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == data


async def test_write_viewer_from_jsonl_files(tmp_path: Path) -> None:
    rollouts = await all_rollouts()
    rollouts_path = tmp_path / "rollouts.jsonl"
    with rollouts_path.open("w") as f:
        write_rollouts_jsonl(rollouts, f)
    samples_path = tmp_path / "samples.jsonl"
    samples_path.write_text(
        "".join(json.dumps(s.to_dict()) + "\n" for s in advantage_samples(rollouts))
    )
    out = write_viewer(rollouts_path, tmp_path / "v.html", samples=samples_path, max_episodes=5)
    page = out.read_text()
    assert page.count("<script") == 2 and "</script><script>document.title" not in page
    assert not re.search(r"https?://", page)  # self-contained: no external resources
    match = re.search(r'<script type="application/json" id="ludic-data">(.*?)</script>', page, re.S)
    assert match is not None
    data = json.loads(match.group(1))
    assert len(data["episodes"]) == 5 and data["source"] == str(rollouts_path)
    assert not data["episodes"][0]["derived_samples"]
    with pytest.raises(FileNotFoundError, match="no rollout file"):
        write_viewer(tmp_path / "missing.jsonl", tmp_path / "x.html")

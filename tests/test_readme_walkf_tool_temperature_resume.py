"""Walk of README "Train your own environment", combined as a user would: the README's own
env (step 1) and training program (step 2), its agent swapped for a `ToolAgent` with one tool
and sampling at temperature 0.7, trained one step, then launched again to resume to step 2.
Each step must stay on-policy (the trainer recomputes logprobs under the temperature the
episodes were sampled at, so every ratio is 1), the tool's schema must reach the prompt, and
the resumed launch must train only the step left. A fresh tiny model never writes a tool call,
so this pins the wiring, not tool use (tests/agents/test_tool_result_json_values.py runs the
tools themselves)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _block_defining(text: str, marker: str) -> str:
    """The ```python block of README.md that contains `marker`."""
    blocks = text.split("```python\n")[1:]
    found = [b.split("\n```", 1)[0] for b in blocks if marker in b]
    assert len(found) == 1, f"expected one README block with {marker!r}, found {len(found)}"
    return found[0]


def lamps_off(lamps: str) -> int:
    """Count the lamps that are off.

    Args:
        lamps: the observation text
    """
    return lamps.count("off")


def _tool_protocol(namespace: dict[str, Any]) -> Any:
    from ludic.agents import ToolAgent
    from ludic.context import LatestObservationContext
    from ludic.inference import SamplingConfig
    from ludic.interaction import SingleAgentProtocol

    def lights_protocol(client: Any) -> SingleAgentProtocol:
        agent = ToolAgent(
            client,
            tools=[lamps_off],
            parser=namespace["lamp_parser"],
            context=LatestObservationContext(),
            sampling=SamplingConfig(max_tokens=6, temperature=0.7),
        )
        return SingleAgentProtocol(agent, max_steps=2)

    return lights_protocol


@pytest.mark.slow
def test_a_tool_agent_at_temperature_0_7_trains_and_resumes_on_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = README.read_text()
    env_block = _block_defining(text, "class LightsEnv(SingleAgentEnv)")
    train_block = _block_defining(text, "async def train(algorithm, steps")
    train_defs = "\n".join(
        line for line in train_block.splitlines() if not line.startswith("checkpoint = ")
    )
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "readme_walkf"}
    exec(compile(env_block, "README.md (step 1)", "exec"), namespace)
    exec(compile(train_defs, "README.md (step 2)", "exec"), namespace)
    namespace["lights_protocol"] = _tool_protocol(namespace)  # what `train` builds per episode
    real_strategy = namespace["GRPORequestStrategy"]
    namespace["GRPORequestStrategy"] = lambda group_size: real_strategy(group_size=2)  # smaller

    out = tmp_path / "runs" / "lights"
    first = asyncio.run(namespace["train"](namespace["make_gigpo"](), steps=1, out=out))
    resumed = asyncio.run(namespace["train"](namespace["make_gigpo"](), steps=2, out=out))
    assert (first.name, resumed.name) == ("step_00000001", "step_00000002")

    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]  # the second launch trained one step
    for m in metrics:
        assert m["batch/num_failed"] == 0
        assert m["loss/ratio_min"] == pytest.approx(1.0, abs=1e-3)  # sampled and recomputed
        assert m["loss/ratio_max"] == pytest.approx(1.0, abs=1e-3)  # at temperature 0.7

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resumed / "model")
    sample = json.loads((out / "samples.jsonl").read_text().splitlines()[-1])
    assert "lamps_off" in tokenizer.decode(
        sample["input_ids"]
    )  # the tool's schema was in the prompt

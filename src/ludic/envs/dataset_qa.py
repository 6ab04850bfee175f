"""DatasetQAEnv: one-shot question answering over one sample of a dataset, scored by a verifier.

The env receives the already-extracted answer (the agent's parser pulls it out of `\\boxed{}`
or a tag); it deliberately does no answer extraction and no multi-turn feedback. One
question, one answer: by default a reply that fails to parse is the episode's answer (a
recorded parse failure with the parser's penalty), not a retry.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ludic.envs.arg_types import checked_arguments
from ludic.envs.base import set_parse_failure_ends_episode
from ludic.envs.single_agent import SingleAgentEnv
from ludic.envs.verifiers import Verifier, exact_match
from ludic.types import Info, StepOutcome

Sample = Mapping[str, Any]
PromptBuilder = Callable[[Sample], str]
TargetParser = Callable[[Sample], str]

_QUESTION_FIELDS = ("question", "prompt", "problem")
_ANSWER_FIELDS = ("answer", "target")


def _field(sample: Sample, names: tuple[str, ...], role: str, hook: str) -> str:
    for name in names:
        if name in sample:
            return str(sample[name])
    raise ValueError(
        f"sample has no {role} field (looked for {', '.join(names)}; it has "
        f"{sorted(map(str, sample))}); pass {hook}= to DatasetQAEnv"
    )


def final_answer(text: str) -> str:
    """The part after the last "####" (GSM8K's convention), else the whole text, stripped."""
    return text.rsplit("####", 1)[-1].strip()


def default_prompt_builder(sample: Sample) -> str:
    """The sample's "question" (or "prompt" / "problem") field."""
    return _field(sample, _QUESTION_FIELDS, "question", "prompt_builder")


def default_target_parser(sample: Sample) -> str:
    """The sample's "answer" (or "target") field, reduced to what follows "####" if present."""
    return final_answer(_field(sample, _ANSWER_FIELDS, "answer", "target_parser"))


class DatasetQAEnv(SingleAgentEnv):
    """One sample per episode: `reset(seed)` picks sample `seed % len(dataset)` (so seeds 0, 1,
    2, ... walk the dataset), a random one for `seed=None`, or always `sample_index` if given.

    The single step scores the action with `verifier(prediction, target)`: the reward is its
    value as a float; `info["correct"]` is True for True or a score >= 1 (`ludic eval`'s success,
    whatever a parser's rewards or a partial score add up to). The episode always
    terminates after that step. `info` holds `target`, `prediction`, `correct`, `sample_index`.

    `parse_failure_ends_episode` (default True): a reply the parser rejects ends the episode
    as a recorded parse failure with the parser's penalty, whatever `max_steps` allows, so
    pass@1 counts first answers. False: format retries; the agent sees the parser's feedback
    and answers again (each retry counts toward the episode's parse failures).
    """

    parse_failure_ends_episode = True  # one answer per episode (see __init__)

    @checked_arguments
    def __init__(
        self,
        dataset: Sequence[Sample],
        *,
        prompt_builder: PromptBuilder = default_prompt_builder,
        target_parser: TargetParser = default_target_parser,
        verifier: Verifier = exact_match,
        system_prompt: str | None = None,
        sample_index: int | None = None,
        parse_failure_ends_episode: bool | None = None,
    ) -> None:
        set_parse_failure_ends_episode(self, parse_failure_ends_episode)
        if isinstance(dataset, (str, bytes)) or not isinstance(dataset, Sequence):
            raise TypeError(
                f"dataset must be a sequence of dicts (e.g. a list), got {type(dataset).__name__}"
            )
        if len(dataset) == 0:
            raise ValueError("dataset is empty; DatasetQAEnv needs at least one sample")
        if sample_index is not None and not 0 <= sample_index < len(dataset):
            raise ValueError(f"sample_index {sample_index} is outside 0..{len(dataset) - 1}")
        self.dataset = dataset
        self.prompt_builder = prompt_builder
        self.target_parser = target_parser
        self.verifier = verifier
        self.system_prompt = system_prompt
        self.sample_index = sample_index
        self.index: int | None = None
        self.target = ""
        self.done = False

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        if self.sample_index is not None:
            index = self.sample_index
        elif seed is None:
            index = random.randrange(len(self.dataset))
        else:
            index = seed % len(self.dataset)
        sample = self.dataset[index]
        if not isinstance(sample, Mapping):
            raise TypeError(f"dataset[{index}] must be a dict, got {type(sample).__name__}")
        prompt = self.prompt_builder(sample)
        self.target = self.target_parser(sample)
        self.index, self.done = index, False
        info: Info = {"sample_index": index}
        if "id" in sample:
            info["sample_id"] = sample["id"]
        return prompt, info

    def env_step(self, action: str) -> StepOutcome:
        name = type(self).__name__
        if self.index is None:
            raise RuntimeError(f"{name}.step called before reset(); call reset(seed) first")
        if self.done:
            raise RuntimeError(
                f"{name}.step called after the episode ended (one answer per episode); "
                "call reset() for the next question"
            )
        self.done = True
        prediction = action if isinstance(action, str) else str(action)
        score = self.verifier(prediction, self.target)
        if not isinstance(score, (bool, int, float)):
            raise TypeError(
                f"verifier must return a bool or float, got {type(score).__name__} ({score!r})"
            )
        correct = score is True or (not isinstance(score, bool) and score >= 1.0)
        return StepOutcome(
            obs="Correct." if correct else "Incorrect.",
            reward=float(score),
            terminated=True,
            info={
                "target": self.target,
                "prediction": prediction,
                "correct": correct,
                "sample_index": self.index,
            },
        )

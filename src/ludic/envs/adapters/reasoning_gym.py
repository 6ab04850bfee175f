"""reasoning-gym's procedural datasets as one-shot QA envs, scored by reasoning-gym itself.

`ReasoningGymEnv("countdown", level=2, min_numbers=4)` or `--env reasoning_gym:countdown
--env-kwargs '{"level": 2}'`. The prompt is the dataset's question under reasoning-gym's own
default system prompt (answer inside `<answer>...</answer>`, which the suggested parser
extracts); the reward is the dataset's `score_answer(answer, entry)`, partial credit included.
One question, one answer: a reply without a parseable answer ends the episode as a recorded
parse failure with the parser's penalty (`parse_failure_ends_episode`), so pass@1 counts
first answers only. It deliberately adds no answer extraction of its own and no multi-turn
feedback.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import fields, is_dataclass
from typing import Any, overload

from ludic.envs.adapters._common import own_keywords, require
from ludic.envs.arg_types import fits, kwarg_refusal
from ludic.envs.dataset_qa import DatasetQAEnv, Sample
from ludic.envs.registry import EnvSpec
from ludic.parsers import Parser, xml_tag_parser
from ludic.types import StepOutcome


def _rg() -> Any:
    return require("reasoning_gym", extra="reasoning-gym", package="reasoning-gym")


def answer_parser() -> Parser:
    """`<answer>...</answer>`, the format reasoning-gym's default system prompt asks for (its
    own `extract_answer` also takes the last such block)."""
    return xml_tag_parser("answer")


class _Entries(Sequence[Mapping[str, Any]]):
    """A reasoning-gym dataset as a lazy sequence: entry i is generated when it is read."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    @overload
    def __getitem__(self, index: int) -> Mapping[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Mapping[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self.dataset[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):  # reasoning-gym generates any index
            raise IndexError(f"entry {index} is outside the {len(self)} of this dataset")
        return self.dataset[index % len(self)]

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        return (self.dataset[i] for i in range(len(self)))


def make_dataset(
    name: str,
    *,
    size: int,
    dataset_seed: int,
    level: int | None,
    config: Mapping[str, Any],
    env_class: type | None = None,
) -> Any:
    """`reasoning_gym.create_dataset(name, seed=, size=, **config)`; with `level`, the
    dataset's curriculum at that global level first sets the difficulty (explicit `config`
    fields still win). Clear errors for an unknown name or a dataset without a curriculum;
    an unknown config field's error lists `env_class`'s keywords (default `ReasoningGymEnv`)."""
    rg = _rg()
    if name not in rg.factory.DATASETS:
        raise ValueError(
            f"reasoning-gym has no dataset {name!r}; choose one of {sorted(rg.factory.DATASETS)}"
        )
    ludic_keywords = own_keywords(env_class or ReasoningGymEnv, ReasoningGymEnv)
    _check_config(name, config, rg.factory.DATASETS[name][1], ludic_keywords)
    _check_types(
        name,
        {"size": size, "dataset_seed": dataset_seed, "level": level, **config},
        rg.factory.DATASETS[name][1],
    )
    args: dict[str, Any] = {}
    if level is not None:
        if not rg.factory.has_curriculum(name):
            raise ValueError(
                f"reasoning-gym dataset {name!r} has no curriculum, so level= does not apply; "
                "set its difficulty with its config fields instead"
            )
        curriculum = rg.factory.create_curriculum(name)
        curriculum.set_global_level(level)
        generated = curriculum.generate_configuration({"seed": dataset_seed, "size": size})
        if is_dataclass(generated):
            args = {f.name: getattr(generated, f.name) for f in fields(generated)}
    args.update(config, seed=dataset_seed, size=size)
    try:
        return rg.create_dataset(name, **args)
    except AssertionError as e:  # the config's own validate(): a value out of its range
        raise ValueError(f"reasoning-gym dataset {name!r} refused its config: {e}") from e


def _check_config(
    name: str, config: Mapping[str, Any], config_cls: Any, ludic_keywords: Sequence[str]
) -> None:
    """Refuse keywords the dataset's config does not have (a typo would otherwise surface as
    a TypeError from inside reasoning-gym) and its `seed` / `size`, which Ludic sets itself."""
    taken = [f.name for f in fields(config_cls) if f.name not in ("seed", "size")]
    if "seed" in config:
        raise ValueError(
            f"reasoning-gym dataset {name!r}: pass dataset_seed, not seed (the episode seed "
            "picks the entry; dataset_seed fixes what the entries are)"
        )
    unknown = sorted(k for k in config if k not in taken)
    if unknown:
        raise ValueError(
            f"reasoning-gym dataset {name!r} has no config field {', '.join(unknown)} "
            f"(--env-kwargs); its fields: {', '.join(taken) or 'none'}; and Ludic's: "
            f"{', '.join(ludic_keywords)}"
        )


_OWN_TYPES: dict[str, Any] = {"size": int, "dataset_seed": int, "level": int | None}


def _check_types(name: str, settings: Mapping[str, Any], config_cls: Any) -> None:
    """Refuse a setting whose value its type refuses (Ludic's `size` / `dataset_seed` / `level`,
    and the dataset config's annotated fields): reasoning-gym takes any value, and `"2"` for
    an int failed inside it as "'<' not supported between instances of 'int' and 'str'"."""
    try:
        types = {**typing.get_type_hints(config_cls), **_OWN_TYPES}
    except Exception:  # an annotation only a type checker can resolve: Ludic's own, then
        types = dict(_OWN_TYPES)
    for key, value in settings.items():
        if key in types and not fits(value, types[key]):
            raise ValueError(
                kwarg_refusal(f"reasoning-gym dataset {name!r}", key, value, types[key])
            )


class ReasoningGymEnv(DatasetQAEnv):
    """One reasoning-gym question per episode. `reset(seed)` takes entry `seed % size` (as
    `DatasetQAEnv` does), so a GRPO group shares one question and seeds 0, 1, ... walk the
    dataset; `dataset_seed` (reasoning-gym's own `seed`) fixes what the entries are.

    `level` picks a curriculum difficulty; other keyword arguments are the dataset's config
    fields (e.g. countdown's `min_numbers`), passed through to reasoning-gym unchanged.
    `info` adds `score` (reasoning-gym's) and `source_dataset`. An unparseable reply ends the
    episode (no protocol asks for a second one), whatever `--max-steps` allows, unless
    `parse_failure_ends_episode=False` (format retries, as in `DatasetQAEnv`).
    """

    def __init__(
        self,
        name: str,
        *,
        size: int = 1000,
        dataset_seed: int = 0,
        level: int | None = None,
        system_prompt: str | None = None,
        sample_index: int | None = None,
        parse_failure_ends_episode: bool | None = None,
        **config: Any,
    ) -> None:
        self.rg_dataset = make_dataset(
            name,
            size=size,
            dataset_seed=dataset_seed,
            level=level,
            config=config,
            env_class=type(self),
        )
        if system_prompt is None:
            system_prompt = _rg().utils.SYSTEM_PROMPTS["default"]
        super().__init__(
            _Entries(self.rg_dataset),
            target_parser=_answer_of,
            verifier=self._score,
            system_prompt=system_prompt,
            sample_index=sample_index,
            parse_failure_ends_episode=parse_failure_ends_episode,
        )
        self.name = name

    def env_step(self, action: str) -> StepOutcome:
        outcome = super().env_step(action)
        entry = self.dataset[self.index or 0]
        source = entry.get("metadata", {}).get("source_dataset", self.name)
        return StepOutcome(
            obs=outcome.obs,
            reward=outcome.reward,
            terminated=outcome.terminated,
            info={**outcome.info, "score": outcome.reward, "source_dataset": source},
        )

    def _score(self, prediction: str, target: str) -> float:
        if self.index is None:
            raise RuntimeError("ReasoningGymEnv scored an answer before reset()")
        entry = self.dataset[self.index]
        return float(self.rg_dataset.score_answer(prediction, entry=entry))


def _answer_of(sample: Sample) -> str:
    return str(sample.get("answer", ""))


def env_spec(name: str) -> EnvSpec:
    """The registry entry for `reasoning_gym:NAME`: the factory and the `<answer>` parser."""
    rg = _rg()
    if name not in rg.factory.DATASETS:
        raise ValueError(
            f"reasoning-gym has no dataset {name!r}; choose one of {sorted(rg.factory.DATASETS)}"
        )
    return EnvSpec(
        name=f"reasoning_gym:{name}",
        factory=lambda **kwargs: ReasoningGymEnv(name, **kwargs),
        parser=answer_parser(),
        description=f"reasoning-gym dataset {name}",
    )

"""`ludic actor`'s run id hashed `--served-model` and `--model` as spelled: an actor naming the
model its server serves (`--served-model NAME`) and one leaving the flag out (the server's one
model, the same NAME) were two runs, so the learner dead-lettered one's samples; an embedded
actor on the default tiny model and one given that directory were two runs; and an embedded
actor (whose weights never change) shared its id with a served actor that left --served-model
out (both hashed None). The id now hashes the model sampled: the served name, or the embedded
model's resolved directory."""

from __future__ import annotations

import dataclasses

from ludic.models import tiny_model_dir
from ludic.pipeline.commands import actor_run_id
from ludic.pipeline.config import ActorConfig

KWARGS = {"opponent": "random"}
URL = ("http://127.0.0.1:8000",)


def _config(**changes: object) -> ActorConfig:
    base = ActorConfig(env="tictactoe", env_kwargs='{"opponent": "random"}', max_tokens=6)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_naming_the_served_model_or_not_is_one_run() -> None:
    asked = actor_run_id(_config(server_url=URL), KWARGS, served_model="tiny")
    named = actor_run_id(_config(server_url=URL, served_model="tiny"), KWARGS, served_model="tiny")
    assert asked == named
    other = actor_run_id(_config(server_url=URL), KWARGS, served_model="big")
    assert other != asked


def test_the_default_tiny_model_and_its_directory_are_one_run() -> None:
    default = actor_run_id(_config(), KWARGS)
    assert default == actor_run_id(_config(model=str(tiny_model_dir())), KWARGS)
    assert default != actor_run_id(_config(model="/models/other"), KWARGS)


def test_an_embedded_actor_is_not_the_run_of_a_served_one() -> None:
    served = actor_run_id(_config(server_url=URL), KWARGS, served_model=None)
    assert served != actor_run_id(_config(), KWARGS)

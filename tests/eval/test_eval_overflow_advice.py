"""`ludic eval`'s closing line for episodes that failed on a prompt longer than the model's
context names the flags that shorten it (--context latest, --max-tokens, --max-steps), as
`ludic train` does; the engine's own error says only to shorten the conversation."""

from __future__ import annotations

from ludic.eval.command import failure_line
from ludic.eval.core import EvalResult
from ludic.types import Rollout

OVERFLOW = (
    "the prompt has 2069 tokens but the model's context is 2048 tokens; shorten the "
    "conversation (or its system prompt and tool list), or use a model with a longer context"
)


def _result(*errors: str) -> EvalResult:
    rollouts = [
        Rollout(steps=[], meta={"error": e, "error_type": "ValueError", "error_phase": "run"})
        for e in errors
    ]
    return EvalResult(rollouts=rollouts, episodes=[], steps=[], metrics={})


def test_an_overflow_names_the_flags_that_shorten_the_dialog() -> None:
    line = failure_line(_result(OVERFLOW))
    assert line is not None and "every one of the 1 episodes failed" in line
    assert "pass --context latest" in line and "fewer --max-steps" in line


def test_another_error_gets_no_such_advice() -> None:
    line = failure_line(_result("my env blew up"))
    assert line is not None and "--context latest" not in line


def test_with_the_latest_observation_only_it_does_not_advise_it_again() -> None:
    line = failure_line(_result(OVERFLOW), context="latest")
    assert line is not None and "--context latest" not in line
    assert "smaller --max-tokens" in line and "shorten the env's observation" in line


def test_a_timeout_names_the_flags_that_give_episodes_time() -> None:
    timed_out = Rollout(
        steps=[],
        meta={
            "error": "episode exceeded episode_timeout_s=600.0",
            "error_type": "TimeoutError",
            "error_phase": "timeout",
        },
    )
    result = EvalResult(rollouts=[timed_out], episodes=[], steps=[], metrics={})
    line = failure_line(result)
    assert line is not None and "counts each episode from its start" in line
    assert "a larger --episode-timeout-s (or None) or a smaller --concurrency" in line
    assert "--context latest" not in line

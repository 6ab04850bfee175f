"""GuessNumberEnv: binary search wins, feedback narrows the interval state key, invalid guesses
change nothing, keys are shared across seeds, misuse errors."""

from __future__ import annotations

import pytest

from ludic.envs.guess_number import GuessNumberEnv


def bisect(env: GuessNumberEnv) -> int:
    """Guess the interval's midpoint until right; return the number of guesses."""
    guesses = 0
    while True:
        guesses += 1
        out = env.env_step(str((env.low + env.high) // 2))
        if out.terminated:
            assert out.reward == 1.0 and out.info["success"] is True
            return guesses


def test_binary_search_finds_every_secret_in_log_steps() -> None:
    env = GuessNumberEnv(max_number=16)
    secrets = set()
    for seed in range(40):
        env.env_reset(seed=seed)
        secrets.add(env.secret)
        assert bisect(env) <= 5  # ceil(log2(16)) + 1
    assert len(secrets) > 8 and secrets <= set(range(1, 17))


def test_feedback_and_interval() -> None:
    env = GuessNumberEnv(max_number=10, step_penalty=0.1)
    obs, info = env.env_reset(seed=0)
    assert obs == "I picked a number between 1 and 10. Your guess?" and info == {"max_number": 10}
    env.secret = 7
    out = env.env_step("4")
    assert out.info == {"guess": 4, "hint": "higher"} and env.env_state_key() == (5, 10)
    assert out.obs == "4 is too low: higher. The number is between 5 and 10. Your guess?"
    assert out.reward == pytest.approx(-0.1) and not out.terminated
    assert env.env_step(" 9 ").info["hint"] == "lower" and env.env_state_key() == (5, 8)
    assert env.env_step("2").info["hint"] == "higher" and env.env_state_key() == (5, 8)
    for junk in ("seven", "0", "11", "7.0", "", "+-3", "9" * 40):
        out = env.env_step(junk)
        assert out.info == {"invalid_action": True} and env.env_state_key() == (5, 8)
    win = env.env_step("+7")
    assert (win.reward, win.terminated, win.obs) == (1.0, True, "7 is correct!")


def test_state_keys_repeat_across_seeds() -> None:
    keys: list[tuple[object, ...]] = []
    for seed in range(10):
        env = GuessNumberEnv(max_number=16)
        env.env_reset(seed=seed)
        path = [env.env_state_key()]
        env.env_step("8")
        path.append(env.env_state_key())
        keys.append(tuple(path))
    assert all(path[0] == (1, 16) for path in keys)
    assert {path[1] for path in keys} <= {(1, 7), (9, 16), (8, 8)}
    assert len({path[1] for path in keys}) < len(keys)


def test_misuse_raises_clear_errors() -> None:
    with pytest.raises(RuntimeError, match="before reset"):
        GuessNumberEnv().env_step("3")
    with pytest.raises(ValueError, match="max_number"):
        GuessNumberEnv(max_number=1)
    env = GuessNumberEnv(max_number=2)
    env.env_reset(seed=0)
    env.env_step(str(env.secret))
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.env_step("1")

"""TextArenaEnv's `llm_seats` must be a list of player numbers and `num_players` an int.
`--env-kwargs '{"llm_seats": "0"}'` failed inside the seat check as "'<=' not supported between
instances of 'int' and 'str'", and `[0.5]` passed it (0 <= 0.5 < 2), giving a seat no player
ever has, so the opponents played the whole game and the model was never asked; both are now
refused naming the keyword and an example, as a refusal (`ludic` prints one line)."""

from __future__ import annotations

import pytest

from ludic.errors import is_refusal

pytest.importorskip("textarena", reason="needs textarena: pip install 'ludic[textarena]'")

from ludic.envs.adapters.textarena import TextArenaEnv


@pytest.mark.parametrize("seats", ["0", [0.5], 0, [True], None])
def test_seats_that_are_not_player_numbers_are_refused(seats: object) -> None:
    with pytest.raises(
        TypeError, match=r"llm_seats must be a list of player numbers \(ints\), "
    ) as caught:
        TextArenaEnv("TicTacToe-v0", llm_seats=seats)  # type: ignore[arg-type]
    assert f"got {seats!r}" in str(caught.value)
    assert is_refusal(caught.value)


@pytest.mark.parametrize("players", ["2", 2.0, 0, True])
def test_a_player_count_that_is_not_an_int_is_refused(players: object) -> None:
    with pytest.raises(TypeError, match=r"num_players must be an int >= 1 or None"):
        TextArenaEnv("TicTacToe-v0", num_players=players)  # type: ignore[arg-type]


def test_player_numbers_as_a_list_or_tuple_pass() -> None:
    assert TextArenaEnv("TicTacToe-v0", llm_seats=[0, 1]).agent_ids == ("player_0", "player_1")
    assert TextArenaEnv("TicTacToe-v0", llm_seats=(1,), num_players=2).agent_ids == ("player_1",)


def test_a_range_or_numpy_ints_are_player_numbers_too() -> None:
    np = pytest.importorskip("numpy")
    assert TextArenaEnv("TicTacToe-v0", llm_seats=range(2)).agent_ids == ("player_0", "player_1")
    env = TextArenaEnv("TicTacToe-v0", llm_seats=list(np.arange(1, 2)))
    assert env.agent_ids == ("player_1",) and type(env.llm_seats[0]) is int

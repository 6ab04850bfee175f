"""KeyDoorGridEnv: every layout is solvable from every start, walls and the locked door stop
the agent, rewards, state keys shared across seeds, misuse errors."""

from __future__ import annotations

import pytest

from ludic.envs.key_door import LAYOUTS, KeyDoorGridEnv, shortest_plan


def floor_cells(layout: int) -> list[tuple[int, int]]:
    rows = LAYOUTS[layout]
    return [(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch == "."]


def test_the_shortest_plan_wins_from_every_start_of_every_layout() -> None:
    for layout in range(len(LAYOUTS)):
        assert all(len(row) == len(LAYOUTS[layout][0]) for row in LAYOUTS[layout])
        for start in floor_cells(layout):
            env = KeyDoorGridEnv(layout=layout)
            env.env_reset(seed=0)
            env.position = start
            plan = shortest_plan(layout, start)
            assert plan.count("pickup") == 1
            outs = [env.env_step(a) for a in plan]
            assert outs[-1].terminated and outs[-1].reward == 1.0
            assert outs[-1].info == {"success": True}
            assert not any(o.terminated for o in outs[:-1])


def test_shortest_plan_is_shortest_on_a_hand_checked_case() -> None:
    # Layout 0, start (3, 1): left, up x3 to the key, pickup, down x3, right x3 to the door.
    assert (
        shortest_plan(0, (3, 1))
        == ["left", "up", "up", "up", "pickup"] + ["down"] * 3 + ["right"] * 3
    )
    assert shortest_plan(0, (0, 0), has_key=True) == ["down"] * 3 + ["right"] * 3


def test_walls_edges_locked_door_pickup_and_invalid_actions() -> None:
    env = KeyDoorGridEnv(layout=0, step_penalty=0.05)
    env.env_reset(seed=0)
    env.position = (3, 2)  # left of the door, no key
    out = env.env_step("right")
    assert out.info == {"bumped": True} and "door is locked" in out.obs and env.position == (3, 2)
    assert out.reward == pytest.approx(-0.05) and not out.terminated
    env.position = (1, 0)
    assert env.env_step("RIGHT ").info == {"bumped": True}  # wall at (1, 1)
    assert env.env_step("left").info == {"bumped": True}  # grid edge
    assert env.env_step("pickup").info == {"picked_up": False}
    assert env.env_step("up").info == {"bumped": False} and env.position == (0, 0)
    junk = env.env_step("fly away")
    assert junk.info == {"invalid_action": True} and "Unknown action 'fly away'" in junk.obs
    assert env.env_step("pickup").info == {"picked_up": True} and env.has_key
    assert "You have the key." in env.env_step("pickup").obs  # a second pickup finds nothing
    assert "K" not in env.render() and env.render().startswith("A")


def test_observation_renders_the_grid_and_the_agent() -> None:
    env = KeyDoorGridEnv(layout=1)
    obs, info = env.env_reset(seed=3)
    r, c = env.position
    assert info == {"layout": 1, "start": [r, c]}
    grid = obs.splitlines()[1:5]
    assert grid[r][c] == "A" and grid[3][0] == "K" and grid[0][3] == "D"
    assert obs.endswith("You do not have the key. Actions: up, down, left, right, pickup.")


def test_seeds_are_deterministic_and_share_states() -> None:
    assert KeyDoorGridEnv().env_reset(seed=11) == KeyDoorGridEnv().env_reset(seed=11)
    layouts = {KeyDoorGridEnv().env_reset(seed=s)[1]["layout"] for s in range(30)}
    assert layouts == {0, 1, 2}
    visited: list[set[object]] = []
    for seed in range(12):
        env = KeyDoorGridEnv()
        env.env_reset(seed=seed)
        keys = {env.env_state_key()}
        for action in shortest_plan(env.layout, env.position):
            env.env_step(action)
            keys.add(env.env_state_key())
        visited.append(keys)
    # The key cell with the key in hand is on every winning path of a layout.
    shared = [k for k in set().union(*visited) if sum(k in v for v in visited) >= 3]
    assert shared and all(isinstance(k, tuple) and len(k) == 4 for k in shared)


def test_misuse_raises_clear_errors() -> None:
    with pytest.raises(RuntimeError, match="before reset"):
        KeyDoorGridEnv().env_step("up")
    with pytest.raises(ValueError, match="layout must be in"):
        KeyDoorGridEnv(layout=7)
    with pytest.raises(ValueError, match="step_penalty"):
        KeyDoorGridEnv(step_penalty=-1)
    env = KeyDoorGridEnv(layout=0)
    env.env_reset(seed=0)
    for action in shortest_plan(0, env.position):
        env.env_step(action)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.env_step("up")

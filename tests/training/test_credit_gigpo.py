"""GiGPO credit: episode-level and anchor-state step-level advantages, by hand."""

from __future__ import annotations

import math

import pytest

from ludic.rollouts.samples import CreditAssigner
from ludic.training.credit import GiGPO, combine_advantages, default_anchor_key
from ludic.types import AgentStep, EnvironmentStep, Rollout, Turn

EPS = 1e-6


def episode(
    turns: list[tuple[str, float]], *, rid: str, group: str = "g", failed: bool = False
) -> Rollout:
    """turns = [(state, reward)]. A state "key:X" is given to the protocol as state_key X;
    any other state is only the observation text (the hash fallback)."""
    steps: list[AgentStep | EnvironmentStep] = []
    for k, (state, reward) in enumerate(turns):
        info: dict[str, object] = {"observation": state}
        if state.startswith("key:"):
            info = {"observation": f"text of {state} in {rid}", "state_key": state[4:]}
        a = AgentStep(index=2 * k, turn_id=f"t{k}", info=info)
        steps += [
            a,
            EnvironmentStep(
                index=2 * k + 1, turn_id=f"t{k}", reward=reward, agent_step_ids=(a.id,)
            ),
        ]
    meta: dict[str, object] = {"group_id": group}
    if failed:
        meta["error"] = "timeout"
    return Rollout(id=rid, steps=steps, meta=meta)


# Group g, gamma = 0.5. S0 and S2 come with env state keys (with different observation texts in
# each episode, so only the key can match them); "room-1" has no key and matches by its text.
#   e1: S0 r=0, room-1 r=1            R=1  G = [0 + .5*1, 1]           = [0.5, 1]
#   e2: S0 r=0, S2 r=0                R=0  G = [0, 0]
#   e3: S0 r=0, room-1 r=0, room-1 r=1  R=1  G = [0 + .5*.5, 0 + .5*1, 1] = [0.25, 0.5, 1]
# Anchor groups: S0 = {e1t0: .5, e2t0: 0, e3t0: .25}; room-1 = {e1t1: 1, e3t1: .5, e3t2: 1}
# (a revisit within e3 joins the group); S2 = {e2t1} alone.
def group_g() -> list[Rollout]:
    return [
        episode([("key:S0", 0.0), ("room-1", 1.0)], rid="e1"),
        episode([("key:S0", 0.0), ("key:S2", 0.0)], rid="e2"),
        episode([("key:S0", 0.0), ("room-1", 0.0), ("room-1", 1.0)], rid="e3"),
    ]


def test_mean_only_normalisation_paper_combination() -> None:
    # A_E = R - mean(R) = [1, 0, 1] - 2/3 = [1/3, -2/3, 1/3]
    # A_S: S0 mean .25 -> [.25, -.25, 0]; room-1 mean 2.5/3 -> [1/6, -1/3, 1/6]; S2 -> 0
    # paper, omega = 1: A = A_E + A_S
    gigpo = GiGPO(gamma=0.5, normalize_std=False, step_normalize_std=False)
    assert isinstance(gigpo, CreditAssigner)
    w = gigpo.assign(group_g())
    expected = {
        ("e1", "t0"): 1 / 3 + 1 / 4,
        ("e1", "t1"): 1 / 3 + 1 / 6,
        ("e2", "t0"): -2 / 3 - 1 / 4,
        ("e2", "t1"): -2 / 3 + 0.0,
        ("e3", "t0"): 1 / 3 + 0.0,
        ("e3", "t1"): 1 / 3 - 1 / 3,
        ("e3", "t2"): 1 / 3 + 1 / 6,
    }
    assert w == pytest.approx(expected, abs=1e-12)


def test_details_report_returns_and_anchor_group_sizes() -> None:
    d = GiGPO(gamma=0.5, normalize_std=False, step_normalize_std=False).details(group_g())
    assert [d[("e3", f"t{k}")].return_to_go for k in range(3)] == pytest.approx([0.25, 0.5, 1.0])
    assert d[("e1", "t0")].anchor_group_size == 3  # S0 by state key across 3 episodes
    assert d[("e1", "t1")].anchor_group_size == 3  # room-1 by observation text, incl. revisit
    assert d[("e2", "t1")].anchor_group_size == 1  # S2 alone
    assert d[("e2", "t1")].step_advantage == 0.0
    assert d[("e2", "t0")].episode_advantage == pytest.approx(-2 / 3, abs=1e-12)


def test_mean_std_normalisation() -> None:
    # A_E: centred [1/3, -2/3, 1/3], sample std sqrt((1/9 + 4/9 + 1/9) / 2) = sqrt(1/3)
    # A_S on S0: centred [.25, -.25, 0], std sqrt((.0625 + .0625) / 2) = .25
    # A_S on room-1: centred [1/6, -1/3, 1/6], std sqrt((1/36 + 1/9 + 1/36) / 2) = sqrt(1/12)
    w = GiGPO(gamma=0.5).assign(group_g())
    s_e, s_0, s_1 = math.sqrt(1 / 3), 0.25, math.sqrt(1 / 12)
    a_e = [(1 / 3) / (s_e + EPS), (-2 / 3) / (s_e + EPS), (1 / 3) / (s_e + EPS)]
    assert w[("e1", "t0")] == pytest.approx(a_e[0] + 0.25 / (s_0 + EPS), abs=1e-9)
    assert w[("e2", "t0")] == pytest.approx(a_e[1] - 0.25 / (s_0 + EPS), abs=1e-9)
    assert w[("e3", "t1")] == pytest.approx(a_e[2] - (1 / 3) / (s_1 + EPS), abs=1e-9)
    assert w[("e2", "t1")] == pytest.approx(a_e[1], abs=1e-12)  # singleton anchor: A_S = 0


def test_seed003_combination_relates_to_paper_form() -> None:
    # seed003: omega'*A_E + (1 - omega')*A_S = omega' * (A_E + ((1 - omega')/omega') * A_S)
    rollouts = group_g()
    paper_1 = GiGPO(gamma=0.5).assign(rollouts)
    seed_half = GiGPO(gamma=0.5, combine="seed003").assign(rollouts)  # default omega 0.5
    assert seed_half == pytest.approx({k: 0.5 * v for k, v in paper_1.items()}, abs=1e-12)
    paper_3 = GiGPO(gamma=0.5, omega=3.0).assign(rollouts)
    seed_quarter = GiGPO(gamma=0.5, omega=0.25, combine="seed003").assign(rollouts)
    assert seed_quarter == pytest.approx({k: 0.25 * v for k, v in paper_3.items()}, abs=1e-12)
    assert combine_advantages(2.0, 4.0, omega=0.25, combine="seed003") == 0.25 * 2 + 0.75 * 4
    assert combine_advantages(2.0, 4.0, omega=0.5, combine="paper") == 2.0 + 0.5 * 4


def test_groups_failed_rollouts_and_other_groups_do_not_share_anchors() -> None:
    # Group h visits S0 too, and a failed g episode visits S0 with a big reward: neither may
    # enter g's S0 anchor group or A_E, so g's numbers are unchanged.
    extra = [
        episode([("key:S0", 50.0)], rid="dead", failed=True),
        episode([("key:S0", 9.0)], rid="h1", group="h"),
    ]
    gigpo = GiGPO(gamma=0.5, normalize_std=False, step_normalize_std=False)
    base = gigpo.assign(group_g())
    w = gigpo.assign([*group_g(), *extra])
    assert {k: v for k, v in w.items() if k[0] != "h1"} == pytest.approx(base, abs=1e-12)
    assert ("dead", "t0") not in w
    # h1 alone: A_E = 0 (group of one), A_S = 0 (anchor of one)
    assert w[("h1", "t0")] == 0.0


def test_observation_fallback_and_state_key_namespaces() -> None:
    a = AgentStep(turn_id="t", info={"observation": "room-1"})
    keyed = AgentStep(turn_id="t", info={"observation": "x", "state_key": "room-1"})
    by_text = default_anchor_key(Turn(turn_id="t", agent_steps=(a,), env_step=None))
    by_key = default_anchor_key(Turn(turn_id="t", agent_steps=(keyed,), env_step=None))
    assert by_text != by_key  # a key never collides with an observation text
    t1 = AgentStep(turn_id="t", info={"state_key": ("pos", 1)})
    t2 = AgentStep(turn_id="t", info={"state_key": ["pos", 1]})  # after a JSON round trip
    k1 = default_anchor_key(Turn(turn_id="t", agent_steps=(t1,), env_step=None))
    k2 = default_anchor_key(Turn(turn_id="t", agent_steps=(t2,), env_step=None))
    assert k1 == k2
    observed_only = Turn(turn_id="o", agent_steps=(), env_step=EnvironmentStep(turn_id="o"))
    assert default_anchor_key(observed_only) is None


def test_turn_without_agent_steps_gets_no_step_advantage() -> None:
    # An outcome observed before acting forms its own turn with no anchor (size 0, A_S = 0).
    r = episode([("key:S0", 1.0)], rid="e")
    r.steps.insert(0, EnvironmentStep(index=0, turn_id="o0", reward=0.0))
    d = GiGPO().details([r, episode([("key:S0", 0.0)], rid="f")])
    assert d[("e", "o0")].anchor_group_size == 0
    assert d[("e", "o0")].step_advantage == 0.0
    assert d[("e", "t0")].anchor_group_size == 2


def test_custom_anchor_key() -> None:
    # Treat every turn as the same state: e1 t0 joins e3 t0's group even without a key match.
    gigpo = GiGPO(
        gamma=0.5, normalize_std=False, step_normalize_std=False, anchor_key=lambda turn: "all"
    )
    d = gigpo.details(group_g())
    assert d[("e1", "t0")].anchor_group_size == 7


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="omega"):
        GiGPO(combine="seed003", omega=1.5)
    with pytest.raises(ValueError, match="combine"):
        GiGPO(combine="other")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gamma"):
        GiGPO(gamma=-0.1)

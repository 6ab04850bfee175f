"""Every preset that takes a KL-to-reference term (`kl_beta`, `kl_estimator`) also takes
`kl_clamp`, which caps a k3 / k3+ estimate: GRPO, REINFORCE++ (and its baseline) and GiGPO.
With kl_beta=0 a KL knob is unread: named by an `UnreadOptionWarning`, refused only when no arm
of a grid could use it."""

from __future__ import annotations

import warnings

import pytest

from ludic.training import make_gigpo, make_grpo, make_reinforce_pp, with_regularizers
from ludic.training.losses import CompositeLoss, KLToReferenceLoss, TokenClippedSurrogateLoss
from ludic.training.option_warnings import UnreadOptionWarning


@pytest.mark.parametrize(
    ("make", "aggregation"),
    [
        (make_grpo, "seq_mean_token_mean"),
        (make_reinforce_pp, "token_mean"),
        (lambda **kw: make_reinforce_pp(group_baseline=True, **kw), "token_mean"),
        (make_gigpo, "token_mean"),
    ],
)
def test_the_kl_presets_pass_kl_clamp_to_the_kl_term(make, aggregation: str) -> None:
    algo = make(kl_beta=0.01, kl_estimator="k3", kl_clamp=10.0)
    assert isinstance(algo.loss, CompositeLoss)
    (_, _), (beta, kl) = algo.loss.terms
    assert beta == 0.01
    assert kl == KLToReferenceLoss(estimator="k3", clamp=10.0, aggregation=aggregation)


@pytest.mark.parametrize("make", [make_reinforce_pp, make_gigpo])
def test_a_clamp_on_an_estimator_it_does_not_apply_to_is_refused(make) -> None:
    with pytest.raises(ValueError, match="clamp applies to 'k3' / 'k3\\+' only"):
        make(kl_beta=0.01, kl_estimator="k1", kl_clamp=10.0)


@pytest.mark.parametrize("make", [make_grpo, make_reinforce_pp, make_gigpo])
def test_an_ablation_grid_passing_kl_clamp_to_its_kl_beta_0_arm_warns_once(make) -> None:
    # kl_beta defaults to 0, which leaves the KL term out: the clamp is unread, which a grid
    # that passes every knob to every arm does on purpose, so it is named, not refused
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        arms = [make(kl_beta=beta, kl_estimator="k3+", kl_clamp=10.0) for beta in (0.0, 0.0, 0.01)]
    unread = [str(w.message) for w in caught if issubclass(w.category, UnreadOptionWarning)]
    assert unread == [
        f"{make.__name__}: kl_clamp=10.0 is ignored: kl_beta=0 leaves the KL-to-reference term "
        "out (pass kl_beta > 0, e.g. 0.04, to use it)",
        f"{make.__name__}: kl_estimator='k3+' is ignored: kl_beta=0 leaves the KL-to-reference "
        "term out (pass kl_beta > 0, e.g. 0.04, to use it)",
    ]
    assert not isinstance(arms[0].loss, CompositeLoss)
    assert isinstance(arms[2].loss, CompositeLoss)


@pytest.mark.parametrize("make", [make_grpo, make_reinforce_pp, make_gigpo])
def test_a_preset_default_estimator_draws_no_warning(make) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreadOptionWarning)
        make()
        make(kl_beta=0.01, kl_clamp=None)


def test_with_regularizers_names_an_unread_estimator() -> None:
    with pytest.warns(UnreadOptionWarning, match="with_regularizers: kl_estimator='k2'"):
        loss = with_regularizers(TokenClippedSurrogateLoss(), kl_estimator="k2")
    assert loss == TokenClippedSurrogateLoss()


@pytest.mark.parametrize("make", [make_grpo, make_reinforce_pp, make_gigpo])
def test_a_kl_option_no_arm_could_use_is_refused_even_at_kl_beta_0(make) -> None:
    with pytest.raises(ValueError, match="clamp applies to 'k3' / 'k3\\+' only"):
        make(kl_estimator="k1", kl_clamp=10.0)
    with pytest.raises(ValueError, match="clamp must be > 0"):
        make(kl_estimator="k3", kl_clamp=-1.0)
    with pytest.raises(ValueError, match="estimator must be one of"):
        make(kl_estimator="k7")

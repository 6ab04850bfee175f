"""Every preset that takes a KL-to-reference term (`kl_beta`, `kl_estimator`) also takes
`kl_clamp`, which caps a k3 / k3+ estimate: GRPO, REINFORCE++ (and its baseline) and GiGPO."""

from __future__ import annotations

import pytest

from ludic.training import make_gigpo, make_grpo, make_reinforce_pp
from ludic.training.losses import CompositeLoss, KLToReferenceLoss


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
def test_a_clamp_without_a_kl_term_is_refused(make) -> None:
    # kl_beta defaults to 0, which leaves the KL term out: the clamp would be ignored silently
    with pytest.raises(ValueError, match=r"kl_clamp=10\.0 caps the KL-to-reference term"):
        make(kl_clamp=10.0)

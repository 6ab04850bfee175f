"""Token sampling: the processed distribution, per-row knobs built once, inverse-CDF draws."""

from __future__ import annotations

import torch

from ludic.inference.embedded.token_sampling import RowKnobs, processed_logprobs, sample_tokens

VOCAB = 6


def test_knobs_skip_the_steps_no_row_needs() -> None:
    plain = RowKnobs.of([1.0, 0.0], [-1, 0], [1.0, 1.0], VOCAB)
    assert not plain.scaled and not plain.filtered  # greedy counts as temperature 1
    assert plain.greedy_B is not None and plain.greedy_B.tolist() == [False, True]
    assert RowKnobs.of([1.0], [-1], [1.0], VOCAB).greedy_B is None
    assert RowKnobs.of([1.0, 0.7], [-1, -1], [1.0, 1.0], VOCAB).scaled
    assert RowKnobs.of([1.0], [3], [1.0], VOCAB).filtered
    assert RowKnobs.of([1.0], [VOCAB], [1.0], VOCAB).filtered is False  # k = vocab keeps all
    assert RowKnobs.of([1.0], [-1], [0.9], VOCAB).filtered


def test_processed_logprobs_apply_each_rows_own_knobs() -> None:
    logits_BV = torch.tensor([[3.0, 1.0, 0.5, 0.0, -1.0, -2.0]] * 4)
    got = processed_logprobs(
        logits_BV,
        torch.tensor([1.0, 0.5, 1.0, 1.0]),
        torch.tensor([-1, -1, 2, -1]),
        torch.tensor([1.0, 1.0, 1.0, 0.8]),
    )
    assert torch.allclose(got[0], torch.log_softmax(logits_BV[0], -1))
    assert torch.allclose(got[1], torch.log_softmax(logits_BV[1] / 0.5, -1))
    top2 = torch.log_softmax(logits_BV[2, :2], -1)
    assert torch.allclose(got[2, :2], top2) and torch.isinf(got[2, 2:]).all()
    # top-p 0.8: the smallest prefix of the sorted probabilities whose mass reaches 0.8
    probs = torch.softmax(logits_BV[3], -1)
    kept = int((probs.cumsum(-1) - probs < 0.8).sum())
    assert torch.isfinite(got[3, :kept]).all() and torch.isinf(got[3, kept:]).all()
    assert torch.allclose(got[3, :kept].exp().sum(), torch.tensor(1.0))


def test_sampling_inverts_the_cdf_and_greedy_rows_take_the_argmax() -> None:
    logprobs_BV = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]] * 3))
    uniforms_B = torch.tensor([0.05, 0.35, 0.35], dtype=torch.float64)
    assert sample_tokens(logprobs_BV, uniforms_B).tolist() == [0, 2, 2]
    greedy_B = torch.tensor([False, False, True])
    assert sample_tokens(logprobs_BV, uniforms_B, greedy_B).tolist() == [0, 2, 3]


def test_a_token_of_probability_zero_is_never_drawn() -> None:
    # The last token is impossible; a uniform at the very top of the CDF would land on it.
    logprobs_BV = torch.log(torch.tensor([[0.5, 0.5, 0.0]]))
    assert sample_tokens(logprobs_BV, torch.tensor([1.0], dtype=torch.float64)).tolist() == [0]


def test_a_top_p_1_row_keeps_its_tail_when_another_row_filters() -> None:
    """One dominant token: in float32 the sorted mass reaches exactly 1.0 before the tail. A row
    with top_p 1 keeps every token, whether or not another row in its batch has top-p on."""
    logits_V = torch.tensor([30.0, 0.0, -1.0, -2.0, -3.0, -4.0])
    assert float(torch.softmax(logits_V, -1).cumsum(-1)[0]) == 1.0  # the premise
    alone = processed_logprobs(
        logits_V[None], torch.tensor([1.0]), torch.tensor([-1]), torch.tensor([1.0])
    )
    batched = processed_logprobs(
        logits_V.repeat(2, 1),
        torch.tensor([1.0, 1.0]),
        torch.tensor([-1, -1]),
        torch.tensor([1.0, 0.5]),
    )
    assert torch.equal(batched[0], alone[0])
    assert torch.equal(alone[0], torch.log_softmax(logits_V, -1))
    assert torch.isfinite(batched[0]).all() and torch.isinf(batched[1, 1:]).all()

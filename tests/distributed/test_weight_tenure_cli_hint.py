"""The refusal a replaced trainer gets says what to do from the command line too (`ludic
train` / `ludic learner` cannot pass `take_over=True`): stop one of the two runs; a restarted
run is a new trainer and takes the server back."""

from __future__ import annotations

from ludic.inference.http.weight_tenure import REPLACED, Tenure, TrainerInfo


def test_the_replaced_trainer_is_told_what_a_cli_user_does() -> None:
    tenure = Tenure()
    old, _ = tenure.begin("127.0.0.1:1000", TrainerInfo(id="run-a", host="a", pid=1))
    _, logged = tenure.begin("127.0.0.1:2000", TrainerInfo(id="run-b", host="b", pid=2))
    assert logged is not None
    said = tenure.replaced_by(old.group)
    assert said is not None and REPLACED in said
    assert "with `ludic train`/`ludic learner`, stop one run" in said
    assert "a restarted run is a new trainer and takes the server back" in said
    assert "BroadcastPolicyPublisher(take_over=True)" in said  # from code

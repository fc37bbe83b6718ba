"""replicas/serve/controller_link.py: when a replica's engine stops waiting for the controller's grants; and the
pusher's own configuration (controller_push.py; its behaviour on a real Ray is tests/serve/test_controller_scale.py)."""

from __future__ import annotations

import pytest

from specserve.replicas.serve.controller_link import LOCAL_RULES_AFTER_ROUNDS, ControllerLink
from specserve.replicas.serve.controller_push import ControllerPusher


def test_not_coordinated_before_the_first_answer_and_coordinated_from_it():
    link = ControllerLink()
    assert not link.coordinated
    assert link.round(answered=True)


def test_one_slow_push_keeps_the_controller_in_charge_a_run_of_them_hands_over_to_local_rules():
    link = ControllerLink()
    link.round(answered=True)
    seen = [link.round(answered=False) for _ in range(LOCAL_RULES_AFTER_ROUNDS)]
    assert seen == [True] * (LOCAL_RULES_AFTER_ROUNDS - 1) + [False]
    assert not link.round(answered=False), "stays local while the controller is away"
    assert link.round(answered=True), "an answer brings coordination back at once"
    assert link.round(answered=False), "and the grace starts over"


def test_a_grace_of_one_round_hands_over_at_the_first_miss():
    link = ControllerLink(grace_rounds=1)
    link.round(answered=True)
    assert not link.round(answered=False)


def test_a_grace_under_one_round_is_refused():
    with pytest.raises(ValueError, match="grace_rounds 0"):
        ControllerLink(grace_rounds=0)


def test_an_unknown_batching_mode_fails_the_replicas_start_naming_the_key():
    async def apply(directive) -> None:
        pass

    with pytest.raises(ValueError, match=r"speculation.controller_batching='per-rack': choose one of auto, none, node"):
        ControllerPusher("node-1", "per-rack", apply)

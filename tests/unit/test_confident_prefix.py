"""confident_prefix: a step's DraftStop read position by position on drafts already made."""

from __future__ import annotations

from specserve.speculation.confident_prefix import confident_prefix


class Threshold:
    def __init__(self, threshold: float) -> None:
        self.threshold, self.asked = threshold, []

    def after_pass(self, position: int, confidence: float) -> bool:
        self.asked.append((position, round(confidence, 6)))
        return confidence < self.threshold


def test_the_rule_is_asked_in_order_with_the_batch_mean_and_the_prefix_ends_at_its_stop() -> None:
    rule = Threshold(0.5)
    assert confident_prefix(rule, [[0.9, 0.8, 0.2, 0.9], [0.7, 0.4, 0.3, 0.9]]) == 3
    assert rule.asked == [(0, 0.8), (1, 0.6), (2, 0.25)]


def test_ragged_drafts_average_over_the_requests_drafted_that_far() -> None:
    rule = Threshold(0.5)
    assert confident_prefix(rule, [[0.9, 0.9, 0.9], [0.1]]) == 3  # position 0's mean, 0.5, is not below
    assert rule.asked == [(0, 0.5), (1, 0.9), (2, 0.9)]
    rule = Threshold(0.6)
    assert confident_prefix(rule, [[0.9, 0.9, 0.9], [0.1]]) == 1
    assert rule.asked == [(0, 0.5)]


def test_a_rule_that_never_stops_keeps_every_drafted_position() -> None:
    assert confident_prefix(Threshold(0.0), [[0.1, 0.1], [0.1, 0.1, 0.1]]) == 3
    assert confident_prefix(Threshold(0.0), []) == 0

"""Verify only the drafts' confident prefix: a step's ``DraftStop`` applied to drafts already made.

vLLM proposes a step's drafts at the end of the step before and verifies them in the next, so its draft loop
cannot be stopped from the scheduler. What it can do is what AdaSpec's trimming and SpecDec++'s stopping threshold
do to the verifier's work: before verification, read each position's confidence (the draft's probability of the
token it drafted), ask the step's rule after each position in order, exactly as a draft loop would ask it after
each pass, and verify only the positions up to the stop. Cutting drafts is lossless (the accepted tokens are a
prefix of the verified ones); what it saves is the target's work on drafts unlikely to be accepted.
"""

from __future__ import annotations

from collections.abc import Sequence

from specserve.speculation.types import DraftStop


def confident_prefix(stop: DraftStop, confidences: Sequence[Sequence[float]]) -> int:
    """How many leading positions to verify: the rule is asked after each position with the mean confidence over
    the requests drafted that far (``DraftStop``'s batch-mean contract); every drafted position if it never stops.
    """
    depth = max((len(c) for c in confidences), default=0)
    for position in range(depth):
        values = [c[position] for c in confidences if len(c) > position]
        if stop.after_pass(position, sum(values) / len(values)):
            return position + 1
    return depth

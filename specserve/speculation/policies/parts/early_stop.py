"""Within one step: stop drafting once the drafts' own confidences say further passes will not pay.

The policy picks k before the step from acceptance averaged over past steps. The draft then proposes its
tokens one pass at a time, and each pass shows how sure the draft was of the token it drafted. AdaSpec
(§4.2, Eq. 7) reads that confidence c as the drafted token's acceptance probability,
so after n passes the batch's expected emitted tokens are ``B * (1 + sum_{j<n} prod_{i<=j} c_i)`` rather
than the prediction from averages. A step whose first drafts are unsure stops early; one whose drafts
are sure may run past the policy's k, up to the budget it was granted.

The rule is the policy's own objective, tokens per second of the decodes, re-evaluated after each pass:
stop after n passes if no number m >= 1 of further passes, each accepted with the policy's per-position
estimate, would raise ``E(n + m) / D(n + m)`` above ``E(n) / D(n)``. D comes from the policy's step-time
model, so the stop and the choice of k never disagree about costs. With a batch, c is the batch mean per
pass (the ``DraftStop`` contract); the product of means is AdaSpec's approximation as well.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class StopCounter:
    """Early stops (a stop before the granted passes ran out) over all the rules one policy hands out: the
    policy shares one counter with its rules, which live only one step each, to report the total."""

    def __init__(self) -> None:
        self.count = 0


class ConfidenceStop:
    """One step's draft loop, a ``DraftStop``: ``after_pass`` says whether to stop after each pass."""

    def __init__(
        self,
        num_running: int,
        decode_seconds: Sequence[float],
        alphas: Sequence[float],
        max_passes: int,
        counter: StopCounter | None = None,
        calibrate: Callable[[float], float] | None = None,
    ) -> None:
        """``decode_seconds[n]``: the decodes' time with n passes, n = 0..max_passes at least;
        ``alphas[j]``: the predicted conditional acceptance at position j, for positions not yet drafted;
        ``calibrate``: a confidence's acceptance (``estimators.confidence_calibration``), else the confidence."""
        if not 1 <= max_passes < len(decode_seconds):
            raise ValueError(f"max_passes={max_passes} needs decode_seconds for 0..{max_passes}")
        self.counter = counter
        self.num_running = num_running
        self.decode_seconds = list(decode_seconds)
        self.alphas = list(alphas)
        self.max_passes = max_passes
        self.calibrate = calibrate
        self._emitted = float(num_running)  # one bonus or correction token per request
        self._survive = 1.0

    def after_pass(self, position: int, confidence: float) -> bool:
        """Pass ``position`` (0-based) ran with batch-mean confidence ``confidence``: True stops the loop."""
        self._survive *= self.calibrate(confidence) if self.calibrate is not None else confidence
        self._emitted += self.num_running * self._survive
        done = position + 1
        if done >= self.max_passes:
            return True
        stop_rate = self._emitted / self.decode_seconds[done]
        emitted, survive = self._emitted, self._survive
        for passes in range(done + 1, self.max_passes + 1):
            survive *= self.alphas[min(passes - 1, len(self.alphas) - 1)]
            emitted += self.num_running * survive
            if emitted / self.decode_seconds[passes] > stop_rate:
                return False
        if self.counter is not None:
            self.counter.count += 1
        return True

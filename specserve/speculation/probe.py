"""Periodic probing while speculation is off, so acceptance estimates cannot freeze.

research/turbospec.md §2.4: "While speculation is off (k = 0) no samples arrive, so alpha_acc stays
frozen." A pessimistic estimate then keeps k at 0 for good even after the workload turns draft-friendly.
TurboSpec escapes a similar lock-in with periodic threshold resets (§2.8, RESETSTEPS); Nightjar with
exploration bins that re-enable speculation at random (research/nightjar.md §2.5). We probe on a clock:
after ``interval_s`` spent at k = 0, speculate for one step to collect fresh verdicts.
"""

from __future__ import annotations


class ZeroProbe:
    """Says when a run of k = 0 steps has lasted long enough to spend one step probing.

    Time comes from the caller (``StepContext.now_s``), never from step counts, so the probe rate is the
    same at any step rate.
    """

    def __init__(self, interval_s: float) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s={interval_s} must be positive")
        self.interval_s = interval_s
        # When the current run of k = 0 began, or the last probe in it; None while speculating.
        self._zero_since_s: float | None = None
        self.num_probes = 0

    def speculating(self) -> None:
        """The policy chose k > 0 on its own: fresh samples are coming, the clock stops."""
        self._zero_since_s = None

    def should_probe(self, now_s: float) -> bool:
        """Called on each step the policy would choose 0; True at most once per interval."""
        if self._zero_since_s is None:
            self._zero_since_s = now_s
            return False
        if now_s - self._zero_since_s < self.interval_s:
            return False
        self._zero_since_s = now_s
        self.num_probes += 1
        return True

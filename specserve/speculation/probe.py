"""Periodic probing while speculation is off, so acceptance estimates cannot freeze.

research/turbospec.md §2.4: "While speculation is off (k = 0) no samples arrive, so alpha_acc stays
frozen." A pessimistic estimate then keeps k at 0 for good even after the workload turns draft-friendly.
TurboSpec escapes a similar lock-in with periodic threshold resets (§2.8, RESETSTEPS); Nightjar with
exploration bins that re-enable speculation at random (research/nightjar.md §2.5). We probe on a clock:
after ``interval_s`` spent at k = 0, speculate until fresh verdicts arrive.

A probe lasts until the first verdict, not one step: in vLLM the drafts proposed in step t are
verified in step t+1, so a one-step probe would be cut back to k = 0 before anything is verified.
"""

from __future__ import annotations


class ZeroProbe:
    """Says when a run of k = 0 steps has lasted long enough to spend one step probing.

    Time comes from the caller (``StepContext.now_s``), never from step counts, so the probe rate is the
    same at any step rate.
    """

    def __init__(self, interval_s: float, max_probe_steps: int = 4) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s={interval_s} must be positive")
        self.interval_s = interval_s
        # A probe whose drafts never get verified (its requests all finished) gives up after this.
        self.max_probe_steps = max_probe_steps
        self._probe_steps_left = 0
        # When the current run of k = 0 began, or the last probe in it; None while speculating.
        self._zero_since_s: float | None = None
        self.num_probes = 0

    def speculating(self) -> None:
        """The policy chose k > 0 on its own: fresh samples are coming, the clock stops."""
        self._zero_since_s = None
        self._probe_steps_left = 0

    def verdict(self) -> None:
        """Acceptance verdicts arrived: the running probe, if any, has done its job."""
        self._probe_steps_left = 0

    def should_probe(self, now_s: float) -> bool:
        """Called on each step the policy would choose 0: True while a probe runs, and a new probe
        starts at most once per interval."""
        if self._probe_steps_left > 0:
            self._probe_steps_left -= 1
            return True
        if self._zero_since_s is None:
            self._zero_since_s = now_s
            return False
        if now_s - self._zero_since_s < self.interval_s:
            return False
        self._zero_since_s = now_s
        self._probe_steps_left = self.max_probe_steps - 1
        self.num_probes += 1
        return True

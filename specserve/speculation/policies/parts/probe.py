"""Periodic probing while speculation is off, so acceptance estimates cannot freeze.

An acceptance estimate learns only from speculative steps (TurboSpec's moving average, §4.1.3): while
speculation is off (k = 0) no samples arrive and the estimate stays frozen. A pessimistic estimate then keeps k
at 0 for good even after the workload turns draft-friendly. TurboSpec escapes a similar lock-in with periodic
threshold resets (§4.2, Listing 1's RESETSTEPS); Nightjar with exploration bins that re-enable speculation at
random (§5.2). We probe on a clock: after ``interval_s`` spent at k = 0, speculate until fresh verdicts arrive.

With ``on_turnover`` a probe also starts once every request whose verdicts the estimate last learned from has left
the batch: acceptance is a property of the requests' text, so an estimate from requests that are gone says little
about the ones that replaced them. At one request a time, on a served CPU engine, one request with a poor draft
took the estimate at position 0 from 0.54 to 0.17 in 50 steps; k went to 0 and stayed there for 114 steps (4 s,
three requests later), at 31 tok/s where the run's k = 3 steps served 47. Such a probe also has the estimate
forget its evidence down to the prior's weight (``GoodputCore.run``): probing each new request without that, the
engine's probes verified one draft each, which moved the estimate by about 3 %, and k stayed at 0 for 268 steps.
Where many requests share the batch, a whole batch turns over more slowly than the clock's interval, and the
rule adds nothing.

A probe lasts until the first verdict, not one step: in vLLM the drafts proposed in step t are
verified in step t+1, so a one-step probe would be cut back to k = 0 before anything is verified.
"""

from __future__ import annotations


class ZeroProbe:
    """Says when a run of k = 0 steps has lasted long enough to spend one step probing.

    Time comes from the caller (``StepContext.now_s``), never from step counts, so the probe rate is the
    same at any step rate.
    """

    def __init__(
        self, interval_s: float, max_probe_steps: int = 4, on_turnover: bool = False, max_turnovers: int = 1
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s={interval_s} must be positive")
        if max_turnovers < 1:
            raise ValueError(f"max_turnovers={max_turnovers} must be at least 1")
        self.interval_s = interval_s
        self.on_turnover = on_turnover
        # Full turnovers of the batch the next turnover probe waits for: 1 after the policy speculated on its own,
        # doubled by each turnover probe (that it still stays at k = 0 is what brings the next), up to
        # ``max_turnovers``. A workload whose every request is as unpredictable as the last would otherwise pay a
        # probe and the draft's catch-up over every running request's context at every turnover, for nothing.
        self.max_turnovers = max_turnovers
        self.turnovers_needed = 1
        self._turnovers = 0
        # The requests of the last step that drafted (speculating or probing): the estimate's latest evidence. Kept as
        # the step's own tuple, so that speculating steps build nothing; compared only at k = 0.
        self._measured: tuple[str, ...] = ()
        # A probe whose drafts never get verified (its requests all finished) gives up after this.
        self.max_probe_steps = max_probe_steps
        self._probe_steps_left = 0
        # When the current run of k = 0 began, or the last probe in it; None while speculating.
        self._zero_since_s: float | None = None
        self.num_probes = 0
        self.num_turnover_probes = 0

    def speculating(self, request_ids: tuple[str, ...] = ()) -> None:
        """The policy chose k > 0 on its own: fresh samples are coming, the clock stops."""
        self._zero_since_s = None
        self._probe_steps_left = 0
        self._measured = request_ids
        self.turnovers_needed, self._turnovers = 1, 0

    def verdict(self) -> None:
        """Acceptance verdicts arrived: the running probe, if any, has done its job."""
        self._probe_steps_left = 0

    def should_probe(self, now_s: float, request_ids: tuple[str, ...] = ()) -> bool:
        """Called on each step the policy would choose 0: True while a probe runs, and a new probe
        starts at most once per interval, or (``on_turnover``) once the batch holds none of the requests
        the estimate last learned from."""
        if self._probe_steps_left > 0:
            self._probe_steps_left -= 1
            return True
        turned_over = False
        if self.on_turnover and request_ids and set(self._measured).isdisjoint(request_ids):
            # Count this batch's turnover from here on.
            self._measured = request_ids
            self._turnovers += 1
            turned_over = self._turnovers >= self.turnovers_needed
        if not turned_over:
            if self._zero_since_s is None:
                self._zero_since_s = now_s
                return False
            if now_s - self._zero_since_s < self.interval_s:
                return False
        self._zero_since_s = now_s
        self._probe_steps_left = self.max_probe_steps - 1
        self._measured = request_ids
        self._turnovers = 0
        if turned_over:
            self.turnovers_needed = min(2 * self.turnovers_needed, self.max_turnovers)
        self.num_probes += 1
        self.num_turnover_probes += int(turned_over)
        return True


def up_steps_for(drafts_ahead: bool) -> int:
    """Steps an upward exploration needs to verify a draft at its new depth (``NeighbourExplorer``)."""
    return 2 if drafts_ahead else 1


class NeighbourExplorer:
    """Says when a policy settled on one k > 0 should spend one step at a neighbouring k.

    An online latency fit learns only along the directions its data varies. Once a policy settles on one
    k, the k-dependent features (batched tokens, draft passes, passes x requests) all move with the batch
    size and the context, so the fit cannot tell the cost of k from the cost of context and may keep the
    policy at a too-high k for good. One step at k - 1 or k + 1 now and then puts the k-direction back in
    the data (persistent excitation, as in adaptive control; Nightjar's exploration bins, §5.2, serve the same
    purpose) and shows the policy the cost of the smaller k it would move down to.

    Like ``ZeroProbe`` it runs on the caller's clock: one step per ``interval_s`` during which the policy's
    own choice stayed at the same k with no gap longer than ``interval_s`` between steps (an idle engine is
    not asked, and a policy whose k moves on its own varies the data already). Directions alternate, down
    first; at ``max_k`` only down.

    A step up lasts ``up_steps`` steps. Where drafts are verified a step after they were made
    (``EngineTraits.drafts_ahead``, vLLM) the first step at k + 1 verifies the k drafts made before it, and
    only a second one verifies k + 1: one step up would pay a pass and never show the acceptance at position
    k + 1, so an estimate there could only drift toward the position before it (``PositionAcceptance``'s
    shrinkage), and nothing would ever pull it back.
    """

    def __init__(self, interval_s: float, up_steps: int = 1) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s={interval_s} must be positive (math.inf turns exploration off)")
        if up_steps < 1:
            raise ValueError(f"up_steps={up_steps} must be at least 1")
        self.interval_s = interval_s
        self.up_steps = up_steps
        # Steps up still to run in the current exploration.
        self._up_left = 0
        # The k the policy has settled on, since when (or since its last exploration step), and the time of
        # the last step asked about; None while not speculating.
        self._k: int | None = None
        self._since_s = 0.0
        self._last_s = 0.0
        self._next_up = False
        self.num_explorations = 0

    def stopped(self) -> None:
        """The policy chose k = 0: the clock stops (at k = 0 only ``ZeroProbe`` runs)."""
        self._k = None

    def neighbour(self, now_s: float, k: int, max_k: int) -> int:
        """The k to run this step: ``k`` itself, or a neighbour once per interval. Needs 0 < k <= max_k."""
        settled = k == self._k and now_s - self._last_s <= self.interval_s
        self._last_s = now_s
        if not settled:
            self._k, self._since_s, self._up_left = k, now_s, 0
            return k
        if self._up_left > 0:
            self._up_left -= 1
            self._since_s = now_s  # the next interval runs from the exploration's last step
            return k + 1
        if now_s - self._since_s < self.interval_s:
            return k
        self._since_s = now_s
        up = self._next_up and k < max_k
        self._next_up = not up
        self.num_explorations += 1
        if up:
            self._up_left = self.up_steps - 1
            return k + 1
        return k - 1

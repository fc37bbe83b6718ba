"""Acceptance collapse as an action (vLLM 0.32.0, EngineCore side): the engine carries out ``CollapseMachine``'s
wishes (``specserve/speculation/collapse.py``, where the detector and the states are explained).

The scheduler asks ``k`` every step (0 while collapsed or restoring, at least 1 while probing) and hands every
``StepRecord`` to ``observe``; ``tick`` runs after each step from the EngineCore's ``post_step`` (it needs the core
to reach the worker). Each transition is one log line, the latest one the telemetry's ``collapse_last_action``.

**Restoring the draft from its source** reuses elastic draft memory's path (``draft_memory/elastic_draft.py``), the
one an operator's ``offload_draft`` then ``reload_draft`` takes, in one pause between two steps: the worker drops
the draft's weights (the bad ones), the pool is grown and at once contracted back (nothing can have taken the grown
blocks: no step ran in between), and the draft is rebuilt from its checkpoint on a worker thread while steps go on
at k = 0; the next ``tick`` after the build swaps it in. The rebuilt draft has no KV: every running request's draft
KV is caught up from its token ids (``DraftKVTracker``), which also replaces whatever the broken draft wrote there.
It works with ``draft_offload`` off (the ``ElasticDraft`` object exists on every speculating engine; only its
triggers need the setting). The transfer is counted as one offload and one reload in the draft-transfer metrics,
with "acceptance collapse" as its reason in the draft's history.

Where that path cannot run, the machine is told why (``restore_refusal``) and only turns speculation off and
probes again: a method without weights (n-gram lookup, suffix), a method whose weights are not a separate draft
(EAGLE heads and MTP layers share the target's embedding; their KV cannot be caught up either), an engine that does
not skip and catch up the draft's k = 0 passes, a GPU engine or a draft without a local checkpoint (elastic draft
memory refuses those).

Private vLLM interfaces: ``VllmConfig.speculative_config.method`` (read once); everything else goes through
``ElasticDraft`` and the scheduler.
"""

from __future__ import annotations

import time
from typing import Any

from specserve.messages.telemetry import CollapseSnapshot, DraftState
from specserve.replicas.engine_log import engine_logger
from specserve.speculation import StepRecord, make_policy
from specserve.speculation.collapse import (
    CollapseMachine,
    CollapseParams,
    CollapseState,
    Transition,
    first_position_trials,
)
from specserve.speculation.methods import Method, Source

logger = engine_logger(__name__)

REASON = "acceptance collapse"
# Steps the policy relearns from once the draft is back: as many as a policy set at run time replays (the
# scheduler's WARM_START_STEPS).
WARM_START_STEPS = 1024


def restore_refusal(scheduler: Any) -> str:
    """Why this engine cannot rebuild its draft from its source ("" where it can)."""
    m: Method = scheduler.method
    if m.source is Source.NONE:
        return f"{m.name} has no weights to restore"
    if not m.restorable:
        return f"restoring a {m.name} draft is not supported: only a separate draft model is rebuilt while serving"
    elastic = scheduler.elastic
    if elastic is None:
        return "the engine does not speculate"
    if elastic.refused:
        return elastic.refused
    if not elastic.draft_bytes:
        return "the draft has no local .safetensors checkpoint to rebuild it from"
    if not scheduler.skips_k0_draft_pass:
        return "skip_k0_draft_pass is off: a rebuilt draft's KV could not be caught up"
    return ""


class CollapseAction:
    """One engine's collapse machine and the engine calls that carry it out."""

    def __init__(self, scheduler: Any, params: CollapseParams | None = None) -> None:
        self.scheduler = scheduler
        self.machine = CollapseMachine(
            params or CollapseParams(),
            restore_refusal=restore_refusal(scheduler),
            has_weights=scheduler.method.source is not Source.NONE,
        )
        # The draft-transfer counts when the restore started: its reload (or failure) is the next one counted.
        self._reloads_before = self._failures_before = 0
        # Wall clock (readers in other processes compare it with theirs): the latest transition, the latest collapse.
        self._last_action_s = self._detected_s = 0.0
        self._restored_s = 0.0  # monotonic, as the step records' now_s

    def k(self, k: int) -> int:
        return self.machine.forced_k(k)

    def observe(self, record: StepRecord) -> None:
        trials, successes = first_position_trials(record.num_drafted_per_request, record.num_accepted_per_request)
        collapses, suspicions = self.machine.num_collapses, self.machine.detector.num_suspicions
        transition = self.machine.observe(record.now_s, trials, successes)
        self._log(transition)
        if self.machine.detector.num_suspicions > suspicions:
            logger.info(
                "specserve: acceptance suspect: first drafts accepted below the floor %.2f, not yet significantly; "
                "k kept at 1 or more until the test decides",
                self.machine.detector.floor,
            )
        if self.machine.num_collapses > collapses:
            self._detected_s = self._last_action_s
        if transition is not None and transition.state is CollapseState.HEALTHY and self.machine.draft_restored:
            self._forget_broken_draft()

    def tick(self, core: Any) -> None:
        """Between two steps: start a restore, notice one that ended, start a probe once the backoff has passed."""
        machine, now = self.machine, time.monotonic()
        if machine.wants_restore(now):
            self._start_restore(core, now)
        elif machine.state is CollapseState.RESTORING:
            self._poll_restore(now)
        else:
            self._log(machine.tick(now))

    def _start_restore(self, core: Any, now: float) -> None:
        elastic = self.scheduler.elastic
        counters = elastic.counters
        self._reloads_before, self._failures_before = counters.num_reloads, counters.num_reload_failures
        reason = f"{REASON}: rebuilding the draft from its checkpoint"
        try:
            if elastic.state is DraftState.RESIDENT:
                elastic.offload(core, reason=reason)
            if elastic.state is DraftState.OFFLOADED:
                elastic.reload(core, reason=reason)
            # Contracting or reloading already (memory pressure's reload): the draft comes back from its source.
        except Exception as exc:  # refused before any change (a transfer of the triggers under way, say)
            logger.exception("specserve: restoring the draft after an acceptance collapse failed")
            self._log(self.machine.restored(now, ok=False, how=f"restore refused: {exc}"))
            return
        self._log(
            self.machine.restoring(now, f"rebuilding the draft from its checkpoint (draft {elastic.state.value})")
        )
        self._poll_restore(now)

    def _poll_restore(self, now: float) -> None:
        elastic = self.scheduler.elastic
        counters = elastic.counters
        if counters.num_reload_failures > self._failures_before:
            self._log(self.machine.restored(now, ok=False, how="rebuilding the draft failed (see the log above)"))
        elif counters.num_reloads > self._reloads_before and elastic.resident:
            how = f"draft rebuilt from its checkpoint in {counters.last_reload_s:.2f} s"
            self._restored_s = now
            self._log(self.machine.restored(now, ok=True, how=how))

    def _forget_broken_draft(self) -> None:
        """The policy learns again from the latest steps but those that verified the broken draft's drafts (from the
        collapse's window to the restore): their acceptance was the fault's, not the pair's, and ``adaptive`` would
        otherwise keep a k chosen for it for as long as its estimate takes to recover."""
        s, bad_since = self.scheduler, self.machine.bad_since_s
        steps = s.counters.num_steps
        history = [
            r
            for r in s.counters.records_since(max(0, steps - WARM_START_STEPS))
            if not bad_since <= r.now_s < self._restored_s
        ]
        s.policy.swap(make_policy(s.policy.spec, s.traits), history)
        logger.info(
            "specserve: policy %s relearned from %d steps without the broken draft's", s.policy.spec, len(history)
        )

    def _log(self, transition: Transition | None) -> None:
        if transition is None:
            return
        log = logger.warning if transition.state is CollapseState.COLLAPSED else logger.info
        log("specserve: acceptance %s: %s", transition.state.value, transition.reason)
        self._last_action_s = time.time()

    def snapshot(self) -> CollapseSnapshot:
        m, d = self.machine, self.machine.detector
        last = m.last
        return CollapseSnapshot(
            collapse_state=m.state,
            num_collapses=m.num_collapses,
            num_collapse_restores=m.num_restores,
            num_collapse_probes_failed=m.num_failed_probes,
            collapse_last_action=f"{last.state.value}: {last.reason}" if last is not None else "",
            collapse_last_action_s=self._last_action_s,
            collapse_detected_s=self._detected_s,
            collapse_baseline=d.baseline,
            collapse_floor=d.floor,
            collapse_restore_refusal=m.restore_refusal,
        )

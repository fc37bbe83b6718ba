"""One simulated vLLM-like engine: continuous batching, paged KV with preemption, speculation.

Each step reads like the real engine's per-step control loop: build a StepContext before scheduling, as
the scheduler subclass in specserve/replicas/ does -> ``policy.choose`` -> schedule with
that k and the decision's per-request caps (running requests first, preempting from the tail when KV
runs out, then admitting waiting requests if nothing was preempted) -> draft (drafting.py: verdicts,
draft-side signals, the policy's early stop) and price the step -> at its end, apply it and
``policy.observe``.

By default a step's drafts are proposed and verified in the same step (k draft passes, then one target pass
over B * (k + 1) decode tokens plus prefill chunks), as the papers model it. vLLM verifies in step t the drafts
proposed in step t - 1 (``EngineConfig.drafts_ahead``): a step at k verifies min(k, the k before) drafts per
request and runs k passes for the next step. The cost and the tokens per step are the same in steady state; a
change of k is not (a rise pays its passes a step before its drafts are verified).
KV slots for the planned drafts are allocated with the step, before drafting (as vLLM's scheduler does),
so drafts an early stop never made keep their slots too; rejected slots stay allocated to the request.
What a step reports (the policy's StepRecord, the StepStats beside it) is built in steps.py.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from specserve.memory import DraftState, ResidencyMachine
from specserve.sim.batch import RequestTable, RunningBatch
from specserve.sim.config import EngineConfig
from specserve.sim.drafting import Drafter, Drafts, StopHook
from specserve.sim.latency import StepTimer
from specserve.sim.proposer import Proposer, proposer_for
from specserve.sim.steps import StepListener, StepStats, further_pass_tokens, step_record
from specserve.speculation import Decision, GuardedPolicy, Policy, PositionAcceptance, StepContext, StepRecord
from specserve.speculation.context import build_step_context, kv_blocks_needed, most_kv_blocks_per_decode
from specserve.speculation.draft_sync import catch_up_plan, draft_pass_room, skips_draft_pass

# ndarray.sum without its Python wrapper (the same reduction): a step sums a dozen small integer arrays.
_sum = np.add.reduce


@dataclass(frozen=True, slots=True)
class _Grant:
    """Tokens granted to each running row this step, aligned with the batch."""

    tokens: np.ndarray  # target tokens computed this step: new tokens plus verified drafts
    drafts: np.ndarray  # of which drafts (0 for rows that prefill), each at most the row's cap
    new_blocks: np.ndarray  # KV blocks to allocate


@dataclass(frozen=True, slots=True)
class _Pending:
    """A started step, applied when it ends."""

    grant: _Grant
    accepted: np.ndarray  # per row, 0 where no drafts
    sampled: np.ndarray  # bool per row: this step samples tokens for the row
    record: StepRecord
    num_preempted: int
    num_waiting: int  # requests left in the queue once the step was scheduled
    proposed: int  # drafts this step made for each row that sampled, verified by the next (drafts_ahead)


def _emitted(pending: _Pending, b: RunningBatch) -> np.ndarray:
    """Tokens the step emits per row: one and its accepted drafts where it samples, up to the request's cap."""
    return np.where(pending.sampled, np.minimum(1 + pending.accepted, b.max_output - b.num_output), 0)


class Replica:
    def __init__(
        self,
        index: int,
        engine: EngineConfig,
        num_kv_blocks: int,
        timer: StepTimer,
        policy: Policy,
        drafter: Drafter,
        table: RequestTable,
        slo_tpot_s: float | None = None,
        on_step: StepListener | None = None,
        jitter_rng: np.random.Generator | None = None,
        proposer: Proposer | None = None,
    ) -> None:
        self.index = index
        self.cfg = engine
        self.num_kv_blocks_total = num_kv_blocks
        self.num_kv_blocks_free = num_kv_blocks
        self.timer = timer
        self.policy = policy
        # Called through the engine's guard, so that a policy misbehaves in the simulator as it would on an engine:
        # a step at k = 0 and a count in ``guard.errors``, not a crash.
        self.guard = GuardedPolicy(policy)
        self.drafter = drafter
        # What the method's proposer runs per step and at k = 0; a draft model on ``engine``'s k = 0 by default.
        self.proposer = proposer if proposer is not None else proposer_for("draft_model", engine)
        self.table = table
        self.slo_tpot_s = slo_tpot_s
        self.on_step = on_step
        # The step-time jitter (``StepTimer.jitter``) draws from a stream of its own: the other streams draw as
        # they did without it.
        self.jitter_rng = jitter_rng if jitter_rng is not None else np.random.default_rng(0)
        self.batch = RunningBatch()
        self.waiting: deque[int] = deque()
        self._pending: _Pending | None = None
        # The in-flight step and what ``in_flight`` found for it: asked at every sync point, computed once a step.
        self._in_flight: tuple[_Pending, tuple[float, int]] | None = None
        # Per-step series for plots: step start time, k, scheduled requests.
        self.series_time_s: list[float] = []
        self.series_k: list[int] = []
        self.series_running: list[int] = []
        # Per step: when it ended and the output tokens it emitted (a closed loop's rate within its window).
        self.series_end_s: list[float] = []
        self.series_tokens: list[int] = []
        self.num_drafted = 0
        self.num_accepted = 0
        # The draft's residency when the scenario offloads (draft_memory.py drives it); None: always resident.
        self.memory: ResidencyMachine | None = None
        # The engine's telemetry estimate of acceptance (the evidence the controller pools into a new replica's
        # prior), kept only where a scale-out seeds new replicas from it: it changes no decision.
        self.acceptance_evidence: PositionAcceptance | None = None
        # The running requests' ids as a tuple, for the batch's ids array it was made from: the batch changes every
        # few dozen steps, a step reads the tuple once or twice (``_request_ids``).
        self._ids_of: np.ndarray | None = None
        self._ids: tuple[str, ...] = ()
        # Each running request's row, for the ids tuple it was made from (``_caps``).
        self._row_of: tuple[tuple[str, ...], dict[str, int]] = ((), {})
        # The running rows' remaining tokens and which decode, as this step's context found them (``_make_room``).
        self._shape: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def draft_resident(self) -> bool:
        return self.memory is None or self.memory.draft_resident

    @property
    def kv_expanded(self) -> bool:
        """The draft is offloaded and its blocks are in the KV pool (not while either is still moving)."""
        return self.memory is not None and self.memory.state is DraftState.OFFLOADED

    @property
    def num_outstanding(self) -> int:
        return len(self.batch.ids) + len(self.waiting)

    def add(self, request: int) -> None:
        self.waiting.append(request)

    # -- the step ------------------------------------------------------------------------------------

    def start_step(self, now_s: float) -> float | None:
        """Schedule and price one step; None when there is nothing to run."""
        if not self.batch.ids.size and not self.waiting:
            return None  # an idle engine runs no step, so its policy is not asked
        ctx = self._context(now_s)
        decision = self.guard.choose(ctx)
        if not ctx.draft_resident and decision.k:
            decision = Decision(k=0)  # no draft on the device: speculation is off whatever the policy says
        k = decision.k
        caps = self._caps(decision, ctx.request_ids)
        grant, num_preempted = self._make_room(k, caps)
        if num_preempted == 0 and self._admit(grant):
            grant = self._grant(k, caps)
        if not np.count_nonzero(grant.tokens):
            return None
        self.num_kv_blocks_free -= int(_sum(grant.new_blocks))
        if self.num_kv_blocks_free < 0:
            raise RuntimeError(f"replica {self.index}: KV over capacity by {-self.num_kv_blocks_free} blocks")
        # Drafts made a step ahead are made before anything asks about them: the loop runs all k passes.
        stop = decision.draft_stop.after_pass if decision.draft_stop and not self.cfg.drafts_ahead else None
        self._pending = self._price(now_s, k, grant, num_preempted, stop)
        return self._pending.record.duration_s

    def end_step(self, now_s: float) -> np.ndarray:
        """Apply the started step's tokens at its end time and let the policy learn from it; the ids of the
        requests it finished."""
        pending, self._pending = self._pending, None
        if pending is None:
            raise RuntimeError(f"replica {self.index}: end_step without a started step")
        b, grant = self.batch, pending.grant
        b.num_blocks += grant.new_blocks
        b.num_computed += grant.tokens - grant.drafts + pending.accepted
        if self.cfg.drafts_ahead:
            b.proposed = np.where(pending.sampled, pending.proposed, 0)
        emitted = _emitted(pending, b)
        b.num_output += emitted
        self.series_end_s.append(now_s)
        self.series_tokens.append(int(_sum(emitted)))
        # A request's first token is stamped when it first samples; one with outputs has had its first token, so
        # only rows without outputs before this step can have theirs now (most steps have none).
        if np.count_nonzero(b.num_output == emitted):
            first = b.ids[pending.sampled]
            first = first[np.isnan(self.table.first_token_s[first])]
            self.table.first_token_s[first] = now_s
        finished = b.num_output >= b.max_output
        num_finished = int(np.count_nonzero(finished))
        done = b.ids[finished]
        if num_finished:
            self.table.num_output[done] = b.num_output[finished]
            self.table.finish_s[done] = now_s
            self.num_kv_blocks_free += int(_sum(b.num_blocks[finished]))
            b.keep(~finished)
        self.guard.observe(pending.record)
        if self.acceptance_evidence is not None:
            self.acceptance_evidence.observe(pending.record)
        if self.on_step is not None:
            used = self.num_kv_blocks_total - self.num_kv_blocks_free
            stats = StepStats(
                self.index,
                int(np.count_nonzero(pending.sampled)),
                pending.num_preempted,
                pending.num_waiting,
                num_finished,
                used,
                self.num_kv_blocks_total,
            )
            self.on_step(pending.record, stats)
        return done

    def in_flight(self) -> tuple[float, int] | None:
        """The started step's end and how many requests it finishes, None when none is running. Both are known when
        the step starts (its verdicts are drawn then, and nothing changes the batch while it runs): a router that
        knows each replica's in-flight step sees its finishes on time (parallel.py)."""
        pending = self._pending
        if pending is None:
            return None
        if self._in_flight is None or self._in_flight[0] is not pending:
            b = self.batch
            finishes = int(np.count_nonzero(b.num_output + _emitted(pending, b) >= b.max_output))
            # The step started at its series' last start time (``_price``): the same sum the event loop schedules.
            self._in_flight = pending, (self.series_time_s[-1] + pending.record.duration_s, finishes)
        return self._in_flight[1]

    # -- the draft's memory (draft_memory.py) ------------------------------------------------------------

    def resize_pool(self, num_blocks: int) -> None:
        """Grow (or, negative, shrink) the KV pool by free blocks: the draft's region after an offload."""
        self.num_kv_blocks_total += num_blocks
        self.num_kv_blocks_free += num_blocks
        if self.num_kv_blocks_free < 0:
            raise RuntimeError(f"replica {self.index}: shrank the KV pool by {-num_blocks} with too few free blocks")

    def draft_reloaded(self) -> None:
        """A reloaded draft has no KV: every running request lags by its whole context (catch-up pays it)."""
        b = self.batch
        b.draft_lag = np.maximum(b.draft_lag, b.num_computed + 1)

    # -- pieces --------------------------------------------------------------------------------------

    def _context(self, now_s: float) -> StepContext:
        b, table = self.batch, self.table
        remaining = b.prompt + b.num_output - b.num_computed
        # A preempted request recomputes its outputs too, so it asks for more than its prompt.
        waiting_tokens = (int(table.prompt_tokens[r] + table.num_output[r]) for r in self.waiting)
        is_decoding = (remaining == 1) & (b.num_output > 0)
        self._shape = (remaining, is_decoding)
        decoding = is_decoding.nonzero()[0]
        cfg = self.cfg
        needed: tuple[int, ...] = ()
        # The simulator allocates what a step computes, without vLLM's lookahead slots (_grant).
        if len(decoding) * most_kv_blocks_per_decode(cfg.block_size, cfg.max_k) > self.num_kv_blocks_free:
            drafts = b.proposed[decoding] if cfg.drafts_ahead else np.full(len(decoding), cfg.max_k)
            needed = kv_blocks_needed(
                b.num_computed[decoding], b.num_blocks[decoding], drafts, block_size=cfg.block_size, max_k=cfg.max_k
            )
        return build_step_context(
            now_s=now_s,
            num_running=len(b),
            num_context_tokens=int(_sum(b.num_computed)),
            running_prefill_tokens=int(_sum(remaining[remaining > 1])),
            num_waiting=len(self.waiting),
            waiting_tokens=waiting_tokens,
            max_num_seqs=self.cfg.max_num_seqs,
            token_budget=self.cfg.max_num_batched_tokens,
            num_kv_blocks_free=self.num_kv_blocks_free,
            num_kv_blocks_total=self.num_kv_blocks_total,
            request_ids=self._request_ids(),
            draft_resident=self.draft_resident,
            slo_tpot_s=self.slo_tpot_s,
            kv_blocks_needed=needed,
        )

    def _request_ids(self) -> tuple[str, ...]:
        """The running requests' ids, in batch order (made again only when the batch's rows changed)."""
        ids = self.batch.ids
        if ids is not self._ids_of:
            self._ids_of, self._ids = ids, tuple(self.table.request_ids[ids])
        return self._ids

    def _caps(self, decision: Decision, request_ids: tuple[str, ...]) -> np.ndarray | None:
        """Drafts allowed per running row (aligned with ``request_ids``), or None when no request is capped.

        Rows stay aligned through scheduling: preemption drops rows from the tail, admission appends
        prefills (which draft nothing) after them.
        """
        if not decision.max_k_per_request:
            return None
        if self._row_of[0] is not request_ids:
            self._row_of = request_ids, {rid: row for row, rid in enumerate(request_ids)}
        row_of = self._row_of[1]
        rids, capped = zip(*decision.max_k_per_request, strict=True)
        rows = [row_of.get(rid, -1) for rid in rids]
        if min(rows) < 0 or min(capped) < 0:
            rid, cap = next((r, c) for r, c, row in zip(rids, capped, rows, strict=True) if row < 0 or c < 0)
            raise ValueError(f"policy {self.policy.spec!r} capped request {rid!r} at {cap}: not running or < 0")
        caps = np.full(len(request_ids), decision.k, dtype=np.int64)
        caps[rows] = np.minimum(capped, decision.k)
        return caps

    def _grant(self, k: int, caps: np.ndarray | None, shape: tuple[np.ndarray, np.ndarray] | None = None) -> _Grant:
        """Token budget in priority order: a decode asks 1 + its k (or cap), a prefill its remaining prompt.
        ``shape``: each row's remaining tokens and whether it decodes, where the caller has them for this batch."""
        b, bs = self.batch, self.cfg.block_size
        if shape is None:
            remaining = b.prompt + b.num_output - b.num_computed
            decoding = (remaining == 1) & (b.num_output > 0)
        else:
            remaining, decoding = shape
        drafts_per_row: int | np.ndarray = k
        if caps is not None:
            n = len(b)
            drafts_per_row = caps[:n] if n <= len(caps) else np.concatenate((caps, np.full(n - len(caps), k)))
        if self.cfg.drafts_ahead:  # only what the last step proposed can be verified
            drafts_per_row = np.minimum(drafts_per_row, b.proposed)
            # The engine's lag rule: drafts made on a draft KV cache with a hole are cut (_cut_lagging_drafts).
            drafts_per_row = np.where(b.draft_lag > 1, 0, drafts_per_row)
        need = np.where(decoding, 1 + drafts_per_row, remaining)
        before = np.cumsum(need) - need
        tokens = np.minimum(np.maximum(self.cfg.max_num_batched_tokens - before, 0), need)
        if not self.cfg.enable_chunked_prefill:
            tokens = np.where(decoding | (tokens == need), tokens, 0)
        drafts = np.where(decoding, np.maximum(tokens - 1, 0), 0)
        new_blocks = np.maximum((b.num_computed + tokens + bs - 1) // bs - b.num_blocks, 0)
        return _Grant(tokens, drafts, new_blocks)

    def _make_room(self, k: int, caps: np.ndarray | None) -> tuple[_Grant, int]:
        """Preempt from the tail (recompute) until the running requests' new KV fits; count them."""
        num_preempted = 0
        # The batch is as the step's context saw it until a preemption: its rows' shape is the context's.
        shape, self._shape = self._shape, None
        grant = self._grant(k, caps, shape)
        while len(self.batch) and int(_sum(grant.new_blocks)) > self.num_kv_blocks_free:
            b, last = self.batch, len(self.batch) - 1
            request = int(b.ids[last])
            self.num_kv_blocks_free += int(b.num_blocks[last])
            self.table.num_output[request] = b.num_output[last]
            self.table.num_preemptions[request] += 1
            self.waiting.appendleft(request)
            b.keep(slice(0, last))
            num_preempted += 1
            grant = self._grant(k, caps)
        return grant, num_preempted

    def _admit(self, grant: _Grant) -> bool:
        """FCFS admission while seats, token budget and free KV blocks last; True if any was admitted."""
        bs, cfg = self.cfg.block_size, self.cfg
        budget = cfg.max_num_batched_tokens - int(_sum(grant.tokens))
        free = self.num_kv_blocks_free - int(_sum(grant.new_blocks))
        admitted: list[int] = []
        while self.waiting and len(self.batch) + len(admitted) < cfg.max_num_seqs and budget > 0:
            request = self.waiting[0]
            num_tokens = int(self.table.prompt_tokens[request] + self.table.num_output[request])
            if num_tokens > budget and not cfg.enable_chunked_prefill:
                break
            tokens = min(num_tokens, budget)
            blocks = -(-tokens // bs)
            if blocks > free:
                break
            self.waiting.popleft()
            admitted.append(request)
            budget, free = budget - tokens, free - blocks
        if admitted:
            self.table.replica[admitted] = self.index
            self.batch.extend(admitted, self.table)
        return bool(admitted)

    def _price(self, now_s: float, k: int, grant: _Grant, num_preempted: int, stop: StopHook | None) -> _Pending:
        b = self.batch
        if not self.cfg.drafts_ahead:
            grant = self._cut_lagging_drafts(grant)
        rows = grant.drafts.nonzero()[0]
        every_row = len(rows) == len(b)
        drafts = None
        if every_row and len(rows):
            # Every running request drafts (the common step): its rows are the batch's, in order.
            drafts = self.drafter.draft(b.alpha, grant.drafts, stop)
            accepted = drafts.accepted
        else:
            accepted = np.zeros(len(b), dtype=np.int64)
            if len(rows):
                drafts = self.drafter.draft(b.alpha[rows], grant.drafts[rows], stop)
                accepted[rows] = drafts.accepted
        if drafts is not None:
            if drafts.stopped_early:
                grant = self._verify_only_drafted(grant, rows, drafts.drafted)
        scheduled = grant.tokens > 0
        new_tokens = grant.tokens - grant.drafts
        # A lookup has nothing to prefill or sync: at k = 0 it runs no search at all.
        lookup_idle = k == 0 and self.proposer.one_pass
        skipped = (
            not self.draft_resident
            or lookup_idle
            # Only a k = 0 step can skip the pass (skips_draft_pass): its counts are not taken otherwise.
            or (
                k == 0
                and skips_draft_pass(
                    enabled=not self.proposer.k0_runs_pass,
                    k=k,
                    num_new_requests=int(np.count_nonzero(scheduled & (b.num_computed == 0))),
                    num_scheduled_tokens=grant.tokens[scheduled].tolist(),
                )
            )
        )
        if self.cfg.drafts_ahead:
            # Every pass drafts for the next step, one token per scheduled request beyond the first pass's read.
            num_passes = k if k > 0 else int(not skipped)
            further = [int(np.count_nonzero(scheduled))] * max(num_passes - 1, 0)
            speculates = k > 0
        else:
            num_passes = drafts.most if drafts else int(not skipped)
            further = further_pass_tokens(drafts, num_passes)
            # Every drafting row drafted at least once (drafting.Drafts), so a step with drafts verifies some.
            speculates = drafts is not None
        if self.proposer.one_pass:
            # One lookup per step finds every draft, for each request it searches (proposer.py).
            draft_pass_tokens = self.proposer.lookup_passes(k, int(np.count_nonzero(scheduled)))
            num_passes = len(draft_pass_tokens)
        elif num_passes:
            read = grant.tokens if self.cfg.draft_first_pass == "scheduled" else new_tokens
            first_pass_tokens = int(_sum(read)) + self._catch_up(scheduled, int(_sum(grant.tokens)), read, new_tokens)
            draft_pass_tokens = [first_pass_tokens, *further]
        else:
            draft_pass_tokens = []
            if self.proposer.method.catches_up():  # a lookup keeps no KV to fall behind
                b.draft_lag += new_tokens
        num_context = int(_sum(b.num_computed[scheduled]))
        num_batched = int(_sum(grant.tokens))
        target_context = self._expanded_context(num_context, rows, drafts)
        parts = self.timer.step_parts(num_context, num_batched, draft_pass_tokens, target_context, speculates)
        jitter = self.timer.jitter(self.jitter_rng)
        forward_s, draft_s, duration_s = parts[0] * jitter, parts[1] * jitter, sum(parts) * jitter
        sampled = scheduled & (b.num_computed + new_tokens == b.prompt + b.num_output)
        request_ids: tuple[str, ...] = ()
        if drafts is not None:
            request_ids = self._request_ids() if every_row else tuple(self.table.request_ids[b.ids[rows]])
        record = step_record(
            now_s,
            k,
            duration_s,
            scheduled,
            num_context,
            num_batched,
            num_passes,
            int(np.count_nonzero(sampled)) + int(_sum(accepted)),
            request_ids,
            drafts,
            (forward_s, draft_s),
        )
        self.num_drafted += record.num_drafted
        self.num_accepted += record.num_accepted
        self.series_time_s.append(now_s)
        self.series_k.append(k)
        self.series_running.append(record.num_running)
        return _Pending(grant, accepted, sampled, record, num_preempted, len(self.waiting), k)

    def _catch_up_plan(self, holes: np.ndarray, num_batched: int, num_scheduled: int) -> dict[str, int]:
        rows = np.flatnonzero(holes)
        lags = {str(r): int(holes[r]) for r in rows}
        room = draft_pass_room(self.cfg.max_num_batched_tokens, num_batched, num_scheduled)
        return catch_up_plan(lags, room, self.cfg.catch_up_max_tokens)

    def _cut_lagging_drafts(self, grant: _Grant) -> _Grant:
        """The engine's lag rule where a step drafts for itself: a request whose draft KV has a hole drafts
        nothing unless this step's pass catches it up whole first (the same plan, over the tokens left after the
        cut)."""
        b = self.batch
        if not np.count_nonzero(b.draft_lag):
            return grant  # nothing lags (most steps)
        lagging = (b.draft_lag > 1) & (grant.drafts > 0)
        if not np.count_nonzero(lagging):
            return grant
        holes = np.maximum(b.draft_lag - 1, 0) * (grant.tokens > 0)
        plan = self._catch_up_plan(holes, int(grant.tokens.sum()), int((grant.tokens > 0).sum()))
        cut = np.array([r for r in np.flatnonzero(lagging) if plan.get(str(r), 0) < holes[r]], dtype=np.int64)
        if not len(cut):
            return grant
        return self._verify_only_drafted(grant, cut, np.zeros(len(cut), dtype=np.int64))

    def _catch_up(self, scheduled: np.ndarray, num_batched: int, read: np.ndarray, new_tokens: np.ndarray) -> int:
        """Tokens the draft's first pass reads beyond ``read`` for lagging requests (the engine's catch-up): a run
        of m skipped steps leaves m - 1 positions unwritten, and the same plan as the engine's picks who fits. A
        request the pass leaves out, or catches up in part (then the pass reads its chunk instead of its tokens),
        still lags, by the step's tokens more."""
        b = self.batch
        if not np.count_nonzero(b.draft_lag):
            return 0  # nothing lags (most steps): no holes, and nothing to clear
        holes = np.maximum(b.draft_lag - 1, 0) * scheduled
        b.draft_lag[scheduled] = 0
        if not np.count_nonzero(holes):
            return 0
        rows = np.flatnonzero(holes)
        plan = self._catch_up_plan(holes, num_batched, int(scheduled.sum()))
        extra = 0
        for r in rows:
            chunk = plan.get(str(r), 0)
            extra += chunk
            if chunk < holes[r]:
                b.draft_lag[r] = holes[r] - chunk + new_tokens[r] + 1
                if chunk:
                    extra -= int(read[r])
        return extra

    def _expanded_context(self, num_context: int, rows: np.ndarray, drafts: Drafts | None) -> int | None:
        """The context the target reads under vLLM V0's batch expansion, None under a single-pass scorer.

        Position j = 0..d of a request with d drafts and c cached tokens is scored as its own sequence of
        c + j tokens, so the request adds d * c + d (d + 1) / 2 to a single pass's read (AdaSpec
        §4.1, Eq. 4 and the authors' code).
        """
        if self.cfg.scorer == "single_pass" or drafts is None:
            return None
        d = drafts.drafted
        extra = d * self.batch.num_computed[rows] + d * (d + 1) // 2
        return num_context + int(extra.sum())

    @staticmethod
    def _verify_only_drafted(grant: _Grant, rows: np.ndarray, drafted: np.ndarray) -> _Grant:
        """After an early stop the target verifies only the drafts made; KV blocks stay as allocated."""
        drafts = grant.drafts.copy()
        drafts[rows] = drafted
        return _Grant(grant.tokens - grant.drafts + drafts, drafts, grant.new_blocks)

"""The replica's metrics, exported through ``ray.util.metrics``; names, kinds, labels and the PromQL for their
ratios are in ``specserve.metrics_catalog``."""

from __future__ import annotations

from ray.util import metrics

from specserve import metrics_catalog as catalog
from specserve.messages import DraftTransfers, EngineTelemetry, PolicySnapshot, SpeculationCounters
from specserve.messages.telemetry import CollapseSnapshot


class ReplicaMetrics:
    """Turns successive ``EngineTelemetry`` reads into gauge values and counter increments.

    Counters in the telemetry are cumulative, so this keeps the previous read and exports deltas; for
    step durations it keeps a cursor (``num_steps_seen``) that the next read passes to the engine.
    """

    def __init__(self, model: str, replica: str) -> None:
        tags = {catalog.MODEL: model, catalog.REPLICA: replica}
        self._k = _gauge(catalog.SPECULATION_K, tags)
        self._max_k = _gauge(catalog.SPECULATION_MAX_K, tags)
        self._policy = _gauge(catalog.POLICY_INFO, tags)
        self._method = _gauge(catalog.METHOD_INFO, tags)
        self._acceptance = _gauge(catalog.ACCEPTANCE_EMA, tags)
        self._drafted = _counter(catalog.DRAFT_TOKENS, tags)
        self._reached = _counter(catalog.REACHED_DRAFT_TOKENS, tags)
        self._accepted = _counter(catalog.ACCEPTED_TOKENS, tags)
        self._steps = _counter(catalog.STEPS, tags)
        self._emitted = _counter(catalog.EMITTED_TOKENS, tags)
        self._policy_time = _counter(catalog.POLICY_SECONDS, tags)
        self._policy_errors = _counter(catalog.POLICY_ERRORS, tags)
        self._drafts_cut = _counter(catalog.DRAFTS_CUT, tags)
        self._step_time = _histogram(catalog.STEP_DURATION, tags)
        self._kv_total = _gauge(catalog.KV_BLOCKS_TOTAL, tags)
        self._kv_free = _gauge(catalog.KV_BLOCKS_FREE, tags)
        self._kv_baseline = _gauge(catalog.KV_BLOCKS_BASELINE, tags)
        self._draft_state = _gauge(catalog.DRAFT_STATE, tags)
        self._transfers = _counter(catalog.DRAFT_TRANSFERS, tags)
        self._transfer_s = _counter(catalog.DRAFT_TRANSFER_SECONDS, tags)
        self._transfer_bytes = _counter(catalog.DRAFT_TRANSFER_BYTES, tags)
        self._reload_failures = _counter(catalog.DRAFT_RELOAD_FAILURES, tags)
        self._migrated = _counter(catalog.KV_BLOCKS_MIGRATED, tags)
        self._migrate_s = _counter(catalog.KV_MIGRATE_SECONDS, tags)
        self._collapses = _counter(catalog.ACCEPTANCE_COLLAPSES, tags)
        self._collapse_state = _gauge(catalog.ACCEPTANCE_COLLAPSE_STATE, tags)
        self._running = _gauge(catalog.NUM_REQUESTS_RUNNING, tags)
        self._waiting = _gauge(catalog.NUM_REQUESTS_WAITING, tags)
        self._controller = _gauge(catalog.CONTROLLER_CONNECTED, tags)
        self._failed_check = _gauge(catalog.STARTUP_CHECK_FAILED, tags)
        self._last: EngineTelemetry | None = None
        self._last_policy: str | None = None
        self._last_draft_state: str | None = None
        self._last_collapse_state: str | None = None

    @property
    def num_steps_seen(self) -> int:
        """The engine's step count at the last update: read the next telemetry with this ``since_step``."""
        return self._last.speculation.num_steps if self._last is not None else 0

    def update(self, now: EngineTelemetry) -> None:
        """``now`` must have been read with ``since_step=self.num_steps_seen``."""
        self._update_policy(now.policy)
        load = now.load
        self._kv_total.set(load.num_kv_blocks_total)
        self._kv_free.set(load.num_kv_blocks_free)
        self._running.set(load.num_running)
        self._waiting.set(load.num_waiting)
        spec, was = now.speculation, (self._last.speculation if self._last is not None else None)
        for pos, alpha in enumerate(now.acceptance_ema.per_pos):
            if spec.num_reached_per_pos[pos] > 0:  # before any verdict the EMA is only its prior
                self._acceptance.set(alpha, tags={catalog.POSITION: str(pos)})
        position = catalog.POSITION
        _add_deltas(self._drafted, position, spec.num_drafted_per_pos, was.num_drafted_per_pos if was else ())
        _add_deltas(self._reached, position, spec.num_reached_per_pos, was.num_reached_per_pos if was else ())
        _add_deltas(self._accepted, position, spec.num_accepted_per_pos, was.num_accepted_per_pos if was else ())
        _add_deltas(self._steps, catalog.K, spec.num_steps_by_k, was.num_steps_by_k if was else ())
        _add_field_delta(self._emitted, "num_emitted_tokens", spec, was)
        _add_field_delta(self._policy_time, "policy_s", spec, was)
        for reason, field in (
            ("cap", "num_drafts_capped"),
            ("lag", "num_drafts_cut_for_lag"),
            ("confidence", "num_drafts_cut_by_confidence"),
        ):
            _add_field_delta(self._drafts_cut, field, spec, was, {catalog.REASON: reason})
        for duration in now.step_durations_s:
            self._step_time.observe(duration)
        # Set every round: Ray stops exporting a gauge series that is not recorded again.
        for check in now.failed_checks:
            self._failed_check.set(1, tags={catalog.CHECK: check})
        self._update_memory(now)
        self._update_collapse(now)
        self._last = now

    def controller_connected(self, connected: bool) -> None:
        """Whether the controller coordinates this replica now (set every round: Ray drops a gauge not set again)."""
        self._controller.set(1 if connected else 0)

    def _update_policy(self, now: PolicySnapshot) -> None:
        before = self._last.policy if self._last is not None else None
        self._k.set(now.k)
        self._max_k.set(now.max_k)
        # Set every round: Ray stops exporting a gauge series that is not recorded again.
        self._method.set(1, tags={catalog.METHOD: now.method, catalog.K0: now.k0})
        if now.spec != self._last_policy:
            if self._last_policy is not None:
                self._policy.set(0, tags={catalog.POLICY: self._last_policy})
            self._policy.set(1, tags={catalog.POLICY: now.spec})
            self._last_policy = now.spec
        for where, count in now.errors.items():
            delta = count - (before.errors.get(where, 0) if before else 0)
            if delta > 0:
                self._policy_errors.inc(delta, tags={catalog.WHERE: where})

    def _update_memory(self, telemetry: EngineTelemetry) -> None:
        now = telemetry.draft_memory
        before = self._last.draft_memory if self._last is not None else None
        self._kv_baseline.set((now.baseline_blocks if now is not None else 0) or telemetry.load.num_kv_blocks_total)
        # The label of an engine without a draft; the enum's values otherwise.
        state = now.state.value if now is not None else "none"
        # Set every round, not only on a change: Ray stops exporting a gauge series that is not recorded again.
        if self._last_draft_state not in (None, state):
            self._draft_state.set(0, tags={catalog.STATE: self._last_draft_state})
        self._draft_state.set(1, tags={catalog.STATE: state})
        self._last_draft_state = state
        if now is None:
            return
        transfers, was = now.transfers, (before.transfers if before is not None else None)
        for direction, count, seconds, moved in (
            ("offload", "num_offloads", "offload_s", "bytes_offloaded"),
            ("reload", "num_reloads", "reload_s", "bytes_reloaded"),
        ):
            for counter, field in (
                (self._transfers, count),
                (self._transfer_s, seconds),
                (self._transfer_bytes, moved),
            ):
                _add_field_delta(counter, field, transfers, was, {catalog.DIRECTION: direction})
        for counter, field in (
            (self._reload_failures, "num_reload_failures"),
            (self._migrated, "blocks_migrated"),
            (self._migrate_s, "migrate_s"),
        ):
            _add_field_delta(counter, field, transfers, was)

    def _update_collapse(self, telemetry: EngineTelemetry) -> None:
        now = telemetry.collapse
        before = self._last.collapse if self._last is not None else None
        state = now.collapse_state.value if now is not None else "none"
        # Set every round, as the draft state: Ray stops exporting a gauge series that is not recorded again.
        if self._last_collapse_state not in (None, state):
            self._collapse_state.set(0, tags={catalog.STATE: self._last_collapse_state})
        self._collapse_state.set(1, tags={catalog.STATE: state})
        self._last_collapse_state = state
        if now is not None:
            _add_field_delta(self._collapses, "num_collapses", now, before)


def _gauge(metric: catalog.Metric, tags: dict[str, str]) -> metrics.Gauge:
    gauge = metrics.Gauge(metric.name, description=metric.description, tag_keys=metric.labels)
    gauge.set_default_tags(tags)
    return gauge


def _counter(metric: catalog.Metric, tags: dict[str, str]) -> metrics.Counter:
    counter = metrics.Counter(metric.name, description=metric.description, tag_keys=metric.labels)
    counter.set_default_tags(tags)
    return counter


def _histogram(metric: catalog.Metric, tags: dict[str, str]) -> metrics.Histogram:
    histogram = metrics.Histogram(
        metric.name, description=metric.description, boundaries=list(metric.boundaries), tag_keys=metric.labels
    )
    histogram.set_default_tags(tags)
    return histogram


def _add_field_delta(
    counter: metrics.Counter,
    field: str,
    now: SpeculationCounters | DraftTransfers | CollapseSnapshot,
    before: SpeculationCounters | DraftTransfers | CollapseSnapshot | None,
    tags: dict[str, str] | None = None,
) -> None:
    """Add what the cumulative counter ``field`` of a telemetry part grew by since ``before`` (None before the first
    read)."""
    delta = getattr(now, field) - (getattr(before, field) if before else 0)
    if delta > 0:
        counter.inc(delta, tags=tags)


def _add_deltas(counter: metrics.Counter, key: str, now: tuple[int, ...], before: tuple[int, ...]) -> None:
    """Add what each labelled count grew by since ``before`` (empty before the first read)."""
    for index, value in enumerate(now):
        delta = value - (before[index] if before else 0)
        if delta > 0:
            counter.inc(delta, tags={key: str(index)})

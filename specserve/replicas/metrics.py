"""Every specserve replica metric, defined once, exported through ``ray.util.metrics``.

Ray prefixes exported names with ``ray_``, so ``specserve_speculation_k`` is scraped as
``ray_specserve_speculation_k`` from Ray's metrics export port. Counters carry numerators and
denominators; take ratios in PromQL, for example

    conditional acceptance at position p:
        rate(ray_specserve_accepted_tokens_total{position="p"}[1m])
      / rate(ray_specserve_reached_draft_tokens_total{position="p"}[1m])
    share of steps at each k:
        rate(ray_specserve_steps_total[1m])
      / ignoring(k) group_left sum without(k) (rate(ray_specserve_steps_total[1m]))
    the policy's share of engine time:
        rate(ray_specserve_policy_seconds_total[1m]) / rate(ray_specserve_step_duration_seconds_sum[1m])
"""

from __future__ import annotations

from ray.util import metrics

from specserve.messages import EngineTelemetry

_TAGS = ("model", "replica")
# Step times on CPU are milliseconds to a few hundred ms; on GPU tens of ms.
_STEP_BOUNDARIES_S = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0]


class ReplicaMetrics:
    """Turns successive ``EngineTelemetry`` reads into gauge values and counter increments.

    Counters in the telemetry are cumulative, so this keeps the previous read and exports deltas; for
    step durations it keeps a cursor (``num_steps_seen``) that the next read passes to the engine.
    """

    def __init__(self, model: str, replica: str) -> None:
        tags = {"model": model, "replica": replica}
        self._k = _gauge("specserve_speculation_k", "Speculation length k chosen for the latest step.", tags)
        self._max_k = _gauge("specserve_speculation_max_k", "Largest k the engine was started with.", tags)
        self._policy = metrics.Gauge(
            "specserve_policy_info",
            description="1 for the policy currently running (label: policy).",
            tag_keys=(*_TAGS, "policy"),
        )
        self._policy.set_default_tags(tags)
        self._acceptance = _gauge(
            "specserve_acceptance_ema",
            "EMA of the conditional acceptance rate per draft position (0-1).",
            tags,
            extra=("position",),
        )
        self._drafted = _counter(
            "specserve_draft_tokens_total", "Draft tokens verified, by position.", tags, "position"
        )
        self._reached = _counter(
            "specserve_reached_draft_tokens_total",
            "Draft tokens verified whose whole prefix was accepted, by position (acceptance denominator).",
            tags,
            "position",
        )
        self._accepted = _counter(
            "specserve_accepted_tokens_total", "Draft tokens accepted, by position.", tags, "position"
        )
        self._steps = _counter("specserve_steps_total", "Engine steps, by the k chosen.", tags, "k")
        self._emitted = _counter("specserve_emitted_tokens_total", "Output tokens produced by engine steps.", tags)
        self._policy_time = _counter(
            "specserve_policy_seconds_total", "Seconds spent in the policy's choose and observe.", tags
        )
        self._step_time = metrics.Histogram(
            "specserve_step_duration_seconds",
            description="Wall time of one engine step.",
            boundaries=_STEP_BOUNDARIES_S,
            tag_keys=_TAGS,
        )
        self._step_time.set_default_tags(tags)
        self._kv_total = _gauge("specserve_kv_blocks_total", "KV cache blocks in the target's pool.", tags)
        self._kv_free = _gauge("specserve_kv_blocks_free", "Free KV cache blocks in the target's pool.", tags)
        self._kv_baseline = _gauge(
            "specserve_kv_blocks_baseline", "KV cache blocks in the pool while the draft is resident.", tags
        )
        self._draft_state = metrics.Gauge(
            "specserve_draft_state",
            description="1 for the draft's current residency (label state: resident, offloaded, contracting).",
            tag_keys=(*_TAGS, "state"),
        )
        self._draft_state.set_default_tags(tags)
        self._transfers = _counter(
            "specserve_draft_transfers_total", "Draft offloads and reloads, by direction.", tags, "direction"
        )
        self._transfer_s = _counter(
            "specserve_draft_transfer_seconds_total", "Seconds spent moving the draft, by direction.", tags, "direction"
        )
        self._transfer_bytes = _counter(
            "specserve_draft_transfer_bytes_total", "Draft bytes moved, by direction.", tags, "direction"
        )
        self._reload_failures = _counter(
            "specserve_draft_reload_failures_total", "Draft reloads that failed (speculation stayed off).", tags
        )
        self._running = _gauge("specserve_num_requests_running", "Requests in the decode batch.", tags)
        self._waiting = _gauge("specserve_num_requests_waiting", "Requests queued for admission.", tags)
        self._last: EngineTelemetry | None = None
        self._last_policy: str | None = None
        self._last_draft_state: str | None = None

    @property
    def num_steps_seen(self) -> int:
        """The engine's step count at the last update: read the next telemetry with this ``since_step``."""
        return self._last.num_steps if self._last is not None else 0

    def update(self, now: EngineTelemetry) -> None:
        """``now`` must have been read with ``since_step=self.num_steps_seen``."""
        self._k.set(now.k)
        self._max_k.set(now.max_k)
        self._kv_total.set(now.num_kv_blocks_total)
        self._kv_free.set(now.num_kv_blocks_free)
        self._running.set(now.num_running)
        self._waiting.set(now.num_waiting)
        if now.policy != self._last_policy:
            if self._last_policy is not None:
                self._policy.set(0, tags={"policy": self._last_policy})
            self._policy.set(1, tags={"policy": now.policy})
            self._last_policy = now.policy
        for pos, alpha in enumerate(now.acceptance_ema_per_pos):
            if now.num_reached_per_pos[pos] > 0:  # before any verdict the EMA is only its prior
                self._acceptance.set(alpha, tags={"position": str(pos)})
        before = self._last
        _add_deltas(self._drafted, "position", now.num_drafted_per_pos, before.num_drafted_per_pos if before else ())
        _add_deltas(self._reached, "position", now.num_reached_per_pos, before.num_reached_per_pos if before else ())
        _add_deltas(self._accepted, "position", now.num_accepted_per_pos, before.num_accepted_per_pos if before else ())
        _add_deltas(self._steps, "k", now.num_steps_by_k, before.num_steps_by_k if before else ())
        emitted = now.num_emitted_tokens - (before.num_emitted_tokens if before else 0)
        if emitted > 0:
            self._emitted.inc(emitted)
        policy_s = now.policy_s - (before.policy_s if before else 0.0)
        if policy_s > 0:
            self._policy_time.inc(policy_s)
        for duration in now.step_durations_s:
            self._step_time.observe(duration)
        self._update_memory(now, before)
        self._last = now

    def _update_memory(self, now: EngineTelemetry, before: EngineTelemetry | None) -> None:
        self._kv_baseline.set(now.num_kv_blocks_baseline or now.num_kv_blocks_total)
        # Set every round, not only on a change: Ray stops exporting a gauge series that is not recorded again.
        if self._last_draft_state not in (None, now.draft_state):
            self._draft_state.set(0, tags={"state": self._last_draft_state})
        self._draft_state.set(1, tags={"state": now.draft_state})
        self._last_draft_state = now.draft_state
        for direction, count, seconds, moved in (
            ("offload", "num_offloads", "offload_s", "bytes_offloaded"),
            ("reload", "num_reloads", "reload_s", "bytes_reloaded"),
        ):
            for counter, field in (
                (self._transfers, count),
                (self._transfer_s, seconds),
                (self._transfer_bytes, moved),
            ):
                delta = getattr(now, field) - (getattr(before, field) if before else 0)
                if delta > 0:
                    counter.inc(delta, tags={"direction": direction})
        failures = now.num_reload_failures - (before.num_reload_failures if before else 0)
        if failures > 0:
            self._reload_failures.inc(failures)


def _gauge(name: str, description: str, tags: dict[str, str], extra: tuple[str, ...] = ()) -> metrics.Gauge:
    gauge = metrics.Gauge(name, description=description, tag_keys=(*_TAGS, *extra))
    gauge.set_default_tags(tags)
    return gauge


def _counter(name: str, description: str, tags: dict[str, str], extra: str | None = None) -> metrics.Counter:
    counter = metrics.Counter(name, description=description, tag_keys=(*_TAGS, *((extra,) if extra else ())))
    counter.set_default_tags(tags)
    return counter


def _add_deltas(counter: metrics.Counter, key: str, now: tuple[int, ...], before: tuple[int, ...]) -> None:
    """Add what each labelled count grew by since ``before`` (empty before the first read)."""
    for index, value in enumerate(now):
        delta = value - (before[index] if before else 0)
        if delta > 0:
            counter.inc(delta, tags={key: str(index)})

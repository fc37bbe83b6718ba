"""Every metric specserve exports, and the Ray and vLLM names its dashboards read: defined once, here.

Pure (no ray, vllm or prometheus_client): ``replicas/serve/metrics.py`` and ``controller/actor.py`` build their
``ray.util.metrics`` objects from these definitions, and ``dashboards/`` builds its PromQL from them.

Ray prepends ``ray_`` on export (``Metric.exported``) and adds its own labels (``RayLabel``) to every series;
Ray Serve LLM exports vLLM's metrics the same way, ``vllm:x`` as ``ray_vllm_x`` (``VllmMetric``). Ray does
not export a counter that has never been incremented, so an event counter appears with its first event.

Counters carry numerators and denominators; the ratios belong in PromQL, for example

    conditional acceptance at position p:
        rate(ray_specserve_accepted_tokens_total{position="p"}[1m])
      / rate(ray_specserve_reached_draft_tokens_total{position="p"}[1m])
    share of steps at each k:
        rate(ray_specserve_steps_total[1m])
      / ignoring(k) group_left sum without(k) (rate(ray_specserve_steps_total[1m]))
    tokens per step:
        rate(ray_specserve_emitted_tokens_total[1m]) / rate(ray_specserve_step_duration_seconds_count[1m])
    the policy's share of engine time:
        rate(ray_specserve_policy_seconds_total[1m]) / rate(ray_specserve_step_duration_seconds_sum[1m])
    mean seconds per draft transfer, by direction, since the replica started:
        ray_specserve_draft_transfer_seconds_total / ray_specserve_draft_transfers_total
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

RAY_PREFIX = "ray_"


class Kind(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"


class RayLabel(StrEnum):
    """Labels Ray adds to every exported series (seen on a live scrape of Ray 2.60)."""

    # The Ray session (one per `ray start` / `specserve serve`): the dashboards' cluster.
    SESSION = "SessionName"
    # IP address of the Ray node the process runs on.
    NODE = "NodeAddress"
    # The Ray worker process that recorded the value (changes when a replica restarts).
    WORKER = "WorkerId"
    COMPONENT = "Component"
    VERSION = "Version"


# Labels of every replica metric: the Serve model id and the Serve replica id (as `specserve status` shows it).
MODEL = "model"
REPLICA = "replica"
REPLICA_LABELS = (MODEL, REPLICA)
# The further labels, each on the metrics that name it.
POLICY = "policy"  # the running policy's spec
METHOD = "method"  # the speculative method (speculation/methods.py): draft_model, eagle, eagle3, mtp, ngram
K0 = "k0"  # what the method's k = 0 does on this engine (methods.K0's words)
POSITION = "position"  # draft position, 0 .. max_k - 1
K = "k"  # speculation length chosen for a step, 0 .. max_k
STATE = "state"  # draft residency (resident, offloaded, ...), acceptance collapse (healthy, collapsed, ...)
DIRECTION = "direction"  # draft transfer: offload, reload
WHERE = "where"  # a policy error: choose, observe, bad_k, describe (speculation/guard.py)
KIND = "kind"  # controller decision: grant_reload, queue_reload, grant_offload, refuse_offload
REASON = "reason"  # drafts cut before verification: cap, lag, confidence
CHECK = "check"  # a start-up check: k_honoured, k0_no_draft_pass, draft_signals (speculation/startup_checks.py)


@dataclass(frozen=True, slots=True)
class Metric:
    """One specserve metric as registered with ``ray.util.metrics``."""

    # The registered name, without Ray's prefix; snake_case, `specserve_`, base units, `_total` on counters.
    name: str
    kind: Kind
    description: str
    # Tag keys, in registration order (Ray wants every key declared up front).
    labels: tuple[str, ...]
    # Histograms only: upper bucket bounds, in the metric's unit.
    boundaries: tuple[float, ...] = ()

    @property
    def exported(self) -> str:
        """The name Prometheus scrapes."""
        return RAY_PREFIX + self.name

    @property
    def extra_labels(self) -> tuple[str, ...]:
        """Labels beyond the replica's own ``model`` and ``replica``."""
        return tuple(label for label in self.labels if label not in REPLICA_LABELS)

    def series(self, suffix: str) -> str:
        """A histogram's scraped series: ``_bucket``, ``_sum`` or ``_count``."""
        if self.kind is not Kind.HISTOGRAM or suffix not in ("_bucket", "_sum", "_count"):
            raise ValueError(f"{self.name} has no {suffix!r} series")
        return self.exported + suffix


def _replica(name: str, kind: Kind, description: str, *extra: str, boundaries: tuple[float, ...] = ()) -> Metric:
    return Metric(name, kind, description, (*REPLICA_LABELS, *extra), boundaries)


# Step times on CPU are milliseconds to a few hundred ms; on GPU tens of ms.
STEP_BOUNDARIES_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)

# -- per replica (replicas/serve/metrics.py) ----------------------------------------------------------------------

SPECULATION_K = _replica("specserve_speculation_k", Kind.GAUGE, "Speculation length k chosen for the latest step.")
SPECULATION_MAX_K = _replica("specserve_speculation_max_k", Kind.GAUGE, "Largest k the engine was started with.")
POLICY_INFO = _replica(
    "specserve_policy_info", Kind.GAUGE, "1 for the policy currently running (label: policy).", POLICY
)
METHOD_INFO = _replica(
    "specserve_speculation_method_info",
    Kind.GAUGE,
    "1 for the replica's speculative method (label method) and what its k = 0 does there (label k0).",
    METHOD,
    K0,
)
ACCEPTANCE_EMA = _replica(
    "specserve_acceptance_ema",
    Kind.GAUGE,
    "EMA of the conditional acceptance rate per draft position (0-1).",
    POSITION,
)
DRAFT_TOKENS = _replica("specserve_draft_tokens_total", Kind.COUNTER, "Draft tokens verified, by position.", POSITION)
REACHED_DRAFT_TOKENS = _replica(
    "specserve_reached_draft_tokens_total",
    Kind.COUNTER,
    "Draft tokens verified whose whole prefix was accepted, by position (acceptance denominator).",
    POSITION,
)
ACCEPTED_TOKENS = _replica(
    "specserve_accepted_tokens_total", Kind.COUNTER, "Draft tokens accepted, by position.", POSITION
)
STEPS = _replica("specserve_steps_total", Kind.COUNTER, "Engine steps, by the k chosen.", K)
EMITTED_TOKENS = _replica("specserve_emitted_tokens_total", Kind.COUNTER, "Output tokens produced by engine steps.")
POLICY_SECONDS = _replica(
    "specserve_policy_seconds_total", Kind.COUNTER, "Seconds spent in the policy's choose and observe."
)
POLICY_ERRORS = _replica(
    "specserve_policy_errors_total",
    Kind.COUNTER,
    "Policy failures the engine absorbed (the step ran at k=0), by where: choose, observe, bad_k, describe.",
    WHERE,
)
DRAFTS_CUT = _replica(
    "specserve_drafts_cut_total",
    Kind.COUNTER,
    "Requests' draft lists cut before verification, by reason: cap (the policy's per-request cap), lag (the "
    "draft's KV has a hole after skipped passes), confidence (the policy's rule kept a confident prefix).",
    REASON,
)
STEP_DURATION = _replica(
    "specserve_step_duration_seconds", Kind.HISTOGRAM, "Wall time of one engine step.", boundaries=STEP_BOUNDARIES_S
)
KV_BLOCKS_TOTAL = _replica("specserve_kv_blocks_total", Kind.GAUGE, "KV cache blocks in the target's pool.")
KV_BLOCKS_FREE = _replica("specserve_kv_blocks_free", Kind.GAUGE, "Free KV cache blocks in the target's pool.")
KV_BLOCKS_BASELINE = _replica(
    "specserve_kv_blocks_baseline", Kind.GAUGE, "KV cache blocks in the pool while the draft is resident."
)
DRAFT_STATE = _replica(
    "specserve_draft_state",
    Kind.GAUGE,
    "1 for the draft's current residency (label state: resident, offloaded, contracting, reloading).",
    STATE,
)
DRAFT_TRANSFERS = _replica(
    "specserve_draft_transfers_total", Kind.COUNTER, "Draft offloads and reloads, by direction.", DIRECTION
)
DRAFT_TRANSFER_SECONDS = _replica(
    "specserve_draft_transfer_seconds_total", Kind.COUNTER, "Seconds spent moving the draft, by direction.", DIRECTION
)
DRAFT_TRANSFER_BYTES = _replica(
    "specserve_draft_transfer_bytes_total", Kind.COUNTER, "Draft bytes moved, by direction.", DIRECTION
)
DRAFT_RELOAD_FAILURES = _replica(
    "specserve_draft_reload_failures_total", Kind.COUNTER, "Draft reloads that failed (speculation stayed off)."
)
KV_BLOCKS_MIGRATED = _replica(
    "specserve_kv_blocks_migrated_total",
    Kind.COUNTER,
    "Live KV blocks moved out of the grown region when the pool contracted.",
)
KV_MIGRATE_SECONDS = _replica(
    "specserve_kv_migrate_seconds_total", Kind.COUNTER, "Seconds spent moving live KV blocks at contraction."
)
ACCEPTANCE_COLLAPSES = _replica(
    "specserve_acceptance_collapses_total",
    Kind.COUNTER,
    "Acceptance collapses the engine detected (first-position acceptance fell below a quarter of its own "
    "established baseline, with confidence) and acted on: speculation off, the draft restored from its checkpoint "
    "where it can be, speculation back once a probe finds acceptance back.",
)
ACCEPTANCE_COLLAPSE_STATE = _replica(
    "specserve_acceptance_collapse_state",
    Kind.GAUGE,
    "1 for the acceptance-collapse machine's current state (label state: healthy, collapsed, restoring, probing; "
    "none without speculation).",
    STATE,
)
NUM_REQUESTS_RUNNING = _replica("specserve_num_requests_running", Kind.GAUGE, "Requests in the decode batch.")
NUM_REQUESTS_WAITING = _replica("specserve_num_requests_waiting", Kind.GAUGE, "Requests queued for admission.")
CONTROLLER_CONNECTED = _replica(
    "specserve_controller_connected",
    Kind.GAUGE,
    "1 while the cluster controller answers this replica's telemetry (cluster policy, draft transfer grants, "
    "acceptance priors); 0 once it has missed several rounds in a row and the replica runs on local rules.",
)
STARTUP_CHECK_FAILED = _replica(
    "specserve_startup_check_failed",
    Kind.GAUGE,
    "1 for each start-up check that failed on this replica's engine (label: check), which then serves under the "
    "fallback fixed:k=max_k; no series while every check passed.",
    CHECK,
)

# -- the cluster controller (controller/actor.py): one per cluster, so no model or replica label --------------

CONTROLLER_MEMORY_DECISIONS = Metric(
    "specserve_controller_memory_decisions_total",
    Kind.COUNTER,
    "Draft transfer decisions of the cluster planner, by kind (grant_reload, queue_reload, ...).",
    (KIND,),
)

REPLICA_METRICS: tuple[Metric, ...] = (
    SPECULATION_K,
    SPECULATION_MAX_K,
    POLICY_INFO,
    METHOD_INFO,
    ACCEPTANCE_EMA,
    DRAFT_TOKENS,
    REACHED_DRAFT_TOKENS,
    ACCEPTED_TOKENS,
    STEPS,
    EMITTED_TOKENS,
    POLICY_SECONDS,
    POLICY_ERRORS,
    DRAFTS_CUT,
    STEP_DURATION,
    KV_BLOCKS_TOTAL,
    KV_BLOCKS_FREE,
    KV_BLOCKS_BASELINE,
    DRAFT_STATE,
    DRAFT_TRANSFERS,
    DRAFT_TRANSFER_SECONDS,
    DRAFT_TRANSFER_BYTES,
    DRAFT_RELOAD_FAILURES,
    KV_BLOCKS_MIGRATED,
    KV_MIGRATE_SECONDS,
    ACCEPTANCE_COLLAPSES,
    ACCEPTANCE_COLLAPSE_STATE,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    CONTROLLER_CONNECTED,
    STARTUP_CHECK_FAILED,
)
CONTROLLER_ACCEPTANCE_PRIORS = Metric(
    "specserve_controller_acceptance_priors_total",
    Kind.COUNTER,
    "Acceptance priors the controller handed to new replicas (their deployment's evidence, averaged).",
    (),
)

ALL_METRICS: tuple[Metric, ...] = (*REPLICA_METRICS, CONTROLLER_MEMORY_DECISIONS, CONTROLLER_ACCEPTANCE_PRIORS)


# -- vLLM's engine metrics, as Ray Serve LLM exports them (vLLM 0.32, Ray 2.60) ------------------------------


class VllmLabel(StrEnum):
    """Labels on vLLM's series besides Ray's own."""

    # The served model id (specserve's ``model``).
    MODEL = "model_name"
    # The Serve replica id (specserve's ``replica``).
    REPLICA = "ReplicaId"
    ENGINE = "engine"


@dataclass(frozen=True, slots=True)
class VllmMetric:
    """A vLLM metric the dashboards read; vLLM defines it (``vllm:`` + ``name``), Ray exports it."""

    name: str
    kind: Kind

    @property
    def exported(self) -> str:
        return f"{RAY_PREFIX}vllm_{self.name}"

    def series(self, suffix: str) -> str:
        if self.kind is not Kind.HISTOGRAM or suffix not in ("_bucket", "_sum", "_count"):
            raise ValueError(f"{self.name} has no {suffix!r} series")
        return self.exported + suffix


VLLM_TIME_TO_FIRST_TOKEN = VllmMetric("time_to_first_token_seconds", Kind.HISTOGRAM)
# Per request: (E2E - TTFT) / (output tokens - 1), the usual TPOT.
VLLM_TIME_PER_OUTPUT_TOKEN = VllmMetric("request_time_per_output_token_seconds", Kind.HISTOGRAM)
VLLM_E2E_LATENCY = VllmMetric("e2e_request_latency_seconds", Kind.HISTOGRAM)
VLLM_NUM_REQUESTS_RUNNING = VllmMetric("num_requests_running", Kind.GAUGE)
VLLM_NUM_REQUESTS_WAITING = VllmMetric("num_requests_waiting", Kind.GAUGE)
# 0-1 despite the name.
VLLM_KV_CACHE_USAGE = VllmMetric("kv_cache_usage_perc", Kind.GAUGE)
# Preemptions per finished request. vLLM's ``num_preemptions_total`` counter counts the same events as they
# happen, but Ray exports it only from the first preemption on, so a panel on it reads "no data" until then.
VLLM_REQUEST_PREEMPTIONS = VllmMetric("request_num_preemptions", Kind.HISTOGRAM)

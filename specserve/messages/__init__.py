"""The messages that cross a process boundary between specserve's parts, and where the controller lives.

    EngineCore --EngineTelemetry--> replica      a dict through vLLM's EngineCore utility call (msgpack)
    replica    --ReplicaSnapshot--> controller   a Ray actor call, about once a second
    controller --PolicyDirective--> replica      the reply to that call
    controller --AcceptancePrior--> replica      the reply to a new replica's first call

``specserve.replicas`` and ``specserve.controller`` both import this package and never each other, so
either side's internals can change alone. It imports no ray, vllm or torch: the CLI, the controller's
bookkeeping and the unit tests use these types without loading a framework.

Every message is a frozen dataclass: a receiver cannot change what the sender meant, and one read is
one consistent picture (all fields taken between the same two engine steps).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# The controller is a named, detached Ray actor: replicas find it by this name in this namespace
# instead of being handed a reference, so a controller restart or a late start needs no redeploy.
CONTROLLER_NAME = "specserve-controller"
CONTROLLER_NAMESPACE = "specserve"
# Ray's resource of the head node alone, asked in a token amount: the controller and the HTTP ingress run there,
# so a worker node that fails takes its engines with it and nothing that routes to or watches the others.
ON_HEAD_NODE = {"node:__internal_head__": 0.001}


@dataclass(frozen=True, slots=True)
class EngineTelemetry:
    """One read of an engine's state, taken between two steps.

    Counters are cumulative since the engine started, so any number of readers can take deltas
    without disturbing each other; a read changes nothing in the engine.
    """

    # Canonical spec of the running policy, e.g. "goodput:max_k=4,...": `specserve status` shows it
    # and `policy set` callers poll it to see a switch land.
    policy: str
    # The k chosen for the most recent step: the status K column and the speculation_k gauge.
    k: int
    # Largest k the engine was started with: `policy set` validates a spec against it before sending.
    max_k: int
    # Requests in the decode batch and in the admission queue: the load behind the k choice.
    num_running: int
    num_waiting: int
    # The target's KV block pool: capacity left for new requests and for speculative lookahead.
    num_kv_blocks_total: int
    num_kv_blocks_free: int
    # Where the draft model's weights are: "resident", "offloaded" (the KV pool grown into their bytes),
    # "contracting" (the grown blocks draining or migrating before the draft reloads), "reloading" (the pool
    # back at its baseline, the draft being rebuilt while steps go on at k = 0), or "none" without speculation.
    # The status DRAFT column and the specserve_draft_state metric read it.
    draft_state: str
    # Steps run so far. Also the reader's cursor for ``step_durations_s`` (see there).
    num_steps: int
    # Output tokens the engine's steps produced: tokens/s by delta.
    num_emitted_tokens: int
    # Steps run at each k, 0..max_k: shows where a policy settles and that a switch took effect.
    num_steps_by_k: tuple[int, ...]
    # Per draft position: drafts verified, drafts whose whole prefix was accepted (the acceptance
    # denominator when k varies), drafts accepted. Positions 0..max_k-1.
    num_drafted_per_pos: tuple[int, ...]
    num_reached_per_pos: tuple[int, ...]
    num_accepted_per_pos: tuple[int, ...]
    # EMA of the conditional acceptance rate per position, the same estimator whatever the policy,
    # so operators can compare policies on it.
    acceptance_ema_per_pos: tuple[float, ...]
    # Wall times of the steps after the step count the reader asked from (its cursor), oldest first,
    # for the step-duration histogram: the last one is step ``num_steps``. The engine keeps only the
    # most recent ones, so a reader that falls far behind gets fewer than ``num_steps - cursor``.
    step_durations_s: tuple[float, ...]
    # Whatever the policy reports about itself (estimates, fitted model, probe counts), for
    # `status --json` and for tests that check a policy's inner state.
    policy_info: dict[str, float]
    # Prefill tokens the step contexts announced to the policy, summed over steps: checks that the policy
    # sees the load the scheduler really runs (an offline batch at max_num_seqs announces none).
    num_prefill_tokens_announced: int
    # Draft lists the policy's per-request caps cut shorter than the step's k before verification.
    num_drafts_capped: int
    # k = 0 decode steps that ran without the draft's forward pass (0 where the engine does not skip it).
    num_steps_draft_skipped: int = 0
    # Draft lists cut to nothing before verification because the request's draft KV has a hole left by
    # skipped passes: such a request drafts again once a later pass has caught its draft KV up.
    num_drafts_cut_for_lag: int = 0
    # Draft lists cut before verification to the prefix the policy's confidence rule keeps (``Decision.draft_stop``
    # read position by position on the drafts' confidences; ``speculation/confident_prefix.py``).
    num_drafts_cut_by_confidence: int = 0
    # Requests whose missed tokens a draft pass prepended (catch-up after skipped passes), and those tokens.
    num_requests_caught_up: int = 0
    num_catch_up_tokens: int = 0
    # Seconds the policy spent in choose and observe, summed over steps: what adaptive control costs the
    # engine, as a share of step time (the policy_seconds_total metric over step_duration_seconds_sum).
    policy_s: float = 0.0
    # The same calls' CPU seconds on the EngineCore's thread: below policy_s by the time other processes held the
    # core while the policy ran (on a small CPU host, vLLM's worker threads).
    policy_cpu_s: float = 0.0
    # Policy failures the engine's guard absorbed (the step ran at k = 0), cumulative, by where: choose, observe,
    # bad_k (an answer outside 0..max_k), describe (``speculation/guard.py``).
    policy_errors: dict[str, int] = dataclasses.field(default_factory=dict)
    # Elastic draft memory: the pool's size with the draft resident, the draft's bytes at the engine's dtype,
    # and draft transfers by direction (count, seconds, bytes) and failed reloads, cumulative.
    num_kv_blocks_baseline: int = 0
    draft_bytes: int = 0
    num_offloads: int = 0
    num_reloads: int = 0
    num_reload_failures: int = 0
    offload_s: float = 0.0
    reload_s: float = 0.0
    bytes_offloaded: int = 0
    bytes_reloaded: int = 0
    # Contractions' block migrations: live blocks moved out of the grown region, and the seconds they took.
    blocks_migrated: int = 0
    migrate_s: float = 0.0
    # Nightjar's triggers (``draft_offload``): what the engine wants and has been granted, why it is where it is,
    # and whether a controller grants (true) or the engine grants itself (false: no controller, local rules).
    offload_wanted: bool = False
    offload_granted: bool = False
    reload_wanted: bool = False
    reload_granted: bool = False
    memory_reason: str = ""
    memory_coordinated: bool = False
    # The telemetry estimator's evidence behind ``acceptance_ema_per_pos``: decayed accepted and reached counts
    # per position. The controller averages them over a deployment's replicas into a new replica's prior.
    acceptance_ema_accepted_per_pos: tuple[float, ...] = ()
    acceptance_ema_reached_per_pos: tuple[float, ...] = ()
    # Start-up checks that failed on this engine (``speculation/startup_checks.py``): it then serves under the
    # fallback policy. `specserve status` shows them and the startup_check_failed metric counts them.
    failed_checks: tuple[str, ...] = ()

    @property
    def acceptance(self) -> float | None:
        """Position-0 EMA acceptance, the headline number operators compare with papers; None until a
        draft has been verified (the estimator's prior is not a measurement)."""
        if not self.num_reached_per_pos or self.num_reached_per_pos[0] == 0:
            return None
        return self.acceptance_ema_per_pos[0]

    def to_dict(self) -> dict[str, Any]:
        """Plain types only: vLLM's utility call serialises results with msgpack."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineTelemetry:
        # msgpack turns tuples into lists; the dataclass holds tuples so it stays hashable and equal.
        return cls(**{f.name: _freeze(data[f.name]) for f in dataclasses.fields(cls)})


@dataclass(frozen=True, slots=True)
class ReplicaSnapshot:
    """What a replica pushes to the controller about once a second."""

    # Ray Serve's replica id: the controller's key and the `policy set --replica` argument.
    replica_id: str
    # Ray node the replica runs on: the status NODE column, to see how replicas spread.
    node_id: str
    # The OpenAI model name the replica serves, for `status --json` when several models are deployed.
    model_id: str
    engine: EngineTelemetry


@dataclass(frozen=True, slots=True)
class PolicyDirective:
    """Controller -> replica: run this policy from the replica's next engine step."""

    # A policy spec NAME[:key=value,...], already validated by the CLI against the engine's max_k.
    policy: str


@dataclass(frozen=True, slots=True)
class AcceptancePrior:
    """Controller -> new replica: its deployment's acceptance evidence, to start from instead of a cold prior.

    Decayed accepted and reached counts per draft position, averaged over the deployment's replicas that have
    verified drafts: one typical replica's recent evidence, so the new replica's own steps outweigh it as soon
    as they would outweigh a peer's history (one estimator half-life)."""

    accepted_per_pos: tuple[float, ...]
    reached_per_pos: tuple[float, ...]
    # Replicas the evidence was averaged over: for the log and the decision's reason.
    num_replicas: int


def _freeze(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value

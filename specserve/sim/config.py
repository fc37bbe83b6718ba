"""The scenario schema: one typed, described, closed pydantic model per component (house rule 6).

A scenario file (YAML) combines hardware, model pair, TP, engine limits, latency model, workload,
acceptance model and an optional SLO. Unknown keys are errors naming the key. Derived values (KV blocks,
per-GPU bytes) are computed in ``scenario.resolve`` and never written back here.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specserve.sim.profiles import LengthDistribution


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineConfig(_Closed):
    max_num_seqs: int = Field(256, gt=0, description="most requests in one step's batch (vLLM max_num_seqs)")
    max_num_batched_tokens: int = Field(8192, gt=0, description="target tokens per step (vLLM budget)")
    block_size: int = Field(16, gt=0, description="tokens per paged KV block")
    max_k: int = Field(8, ge=0, description="largest speculation length; sizes vLLM's buffers")
    k0_runs_draft_pass: bool = Field(
        True,
        description="k=0 still runs one draft pass to keep the draft KV in sync (vLLM as shipped); false: k=0 "
        "decode steps skip it and the next pass catches the draft's KV up (specserve's engine)",
    )
    catch_up_max_tokens: int | None = Field(
        None,
        gt=0,
        description="most tokens one step's draft pass catches lagging requests' draft KV up over (the shortest lag "
        "goes whatever its length); null: what the token budget leaves, as specserve's GPU engines do (its CPU "
        "engines cap at 512)",
    )
    enable_chunked_prefill: bool = Field(True, description="split long prompts across steps (vLLM V1 default)")
    draft_first_pass: Literal["new_tokens", "scheduled"] = Field(
        "new_tokens",
        description="what a step's first draft pass reads: 'new_tokens', only tokens the draft has not seen (its own "
        "drafts stay in its KV cache); 'scheduled', every token the target scores that step, drafts included, as "
        "vLLM's draft-model proposer re-reads them (the CPU engine engine-check replays)",
    )
    drafts_ahead: bool = Field(
        False,
        description="drafts are made at the end of a step for the next, as vLLM's proposer does: a step at k verifies "
        "min(k, the previous step's k) drafts per request and runs k passes for the next step, so a rise in k pays "
        "its passes a step before its drafts count. false: a step drafts and verifies its own k (the papers' model; "
        "the same in steady state). The draft loop cannot then be stopped early",
    )
    scorer: Literal["single_pass", "batch_expansion"] = Field(
        "single_pass",
        description="how the target verifies drafts: one pass over every request's k + 1 tokens (vLLM "
        "V1, V0's MQA scorer), or vLLM V0's batch expansion, which scores position j of each request as its own "
        "sequence with context + j cached tokens, so the target reads each request's KV k + 1 times (AdaSpec Eq. 4)",
    )
    startup_calibration: bool = Field(
        True,
        description="each replica's policy starts from the start-up calibration's steps (fixed k = 0 .. max_k on "
        "dummy requests at a few batch sizes up to max_num_seqs, their costs only), as specserve's engine starts it "
        "unless speculation.startup_checks is off; false: from its priors alone",
    )
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="fraction of device memory vLLM may use")
    reserved_gib: float = Field(1.5, ge=0, description="activations, CUDA graphs and workspace per GPU")
    num_kv_blocks: int | None = Field(None, gt=0, description="override the KV capacity computed from memory")
    max_model_len: int = Field(4096, gt=1, description="prompt + output cap per request")


class LatencyConfig(_Closed):
    kind: Literal["roofline", "linear"] = Field(
        "roofline", description="'linear' reads TurboSpec Eq. 3 coefficients from the pair's profile for this hardware"
    )
    bandwidth_efficiency: float = Field(0.8, gt=0, le=1, description="reachable fraction of datasheet bandwidth")
    flops_efficiency: float = Field(0.6, gt=0, le=1, description="reachable fraction of datasheet FLOPs")
    forward_overhead_s: float = Field(3e-4, ge=0, description="launch cost per forward pass (roofline)")
    step_overhead_s: float = Field(1e-3, ge=0, description="scheduling and sampling per step (roofline)")
    cuda_graphs: bool = Field(
        True, description="the engine replays CUDA graphs; false: it runs eagerly (vLLM enforce_eager=True)"
    )
    # Both per-layer costs are fitted to the papers' step times (latency_check.py, bench/results/latency-check.md).
    layer_overhead_s: float = Field(
        5e-6,
        ge=0,
        description="fixed cost per transformer layer per forward pass under CUDA graphs: the small "
        "kernels (norms, rotary, activation, residual adds) that take microseconds whatever the model size (roofline)",
    )
    eager_layer_overhead_s: float = Field(
        9e-5,
        ge=0,
        description="fixed cost per transformer layer per forward pass when eager: Python dispatch of "
        "each layer's kernels, not hidden behind GPU work (roofline; SpecKV's vLLM enforce_eager runs)",
    )


class RateSegment(_Closed):
    duration_s: float = Field(gt=0)
    rate_qps: float = Field(ge=0, description="Poisson arrival rate, requests per second")


class PoissonArrivals(_Closed):
    kind: Literal["poisson"]
    rate_qps: float = Field(gt=0)
    duration_s: float = Field(gt=0)


class PiecewiseArrivals(_Closed):
    kind: Literal["piecewise"]
    segments: list[RateSegment] = Field(min_length=1, description="consecutive constant-rate Poisson segments")


class BurstArrivals(_Closed):
    """Nightjar Appendix C 'burst spike': a base rate with one spike."""

    kind: Literal["burst"]
    base_qps: float = Field(ge=0)
    peak_qps: float = Field(gt=0)
    burst_start_s: float = Field(ge=0)
    burst_duration_s: float = Field(gt=0)
    duration_s: float = Field(gt=0)


class OscillationArrivals(_Closed):
    """Nightjar Appendix C 'high/low oscillation': alternating half periods, starting high."""

    kind: Literal["oscillation"]
    high_qps: float = Field(ge=0)
    low_qps: float = Field(ge=0)
    period_s: float = Field(gt=0)
    duration_s: float = Field(gt=0)


class MultiPeakArrivals(_Closed):
    """Nightjar Appendix C 'synchronised multi-peak': several equal spikes over a base rate."""

    kind: Literal["multi_peak"]
    base_qps: float = Field(ge=0)
    peak_qps: float = Field(gt=0)
    peak_starts_s: list[float] = Field(min_length=1)
    peak_duration_s: float = Field(gt=0)
    duration_s: float = Field(gt=0)


class ClientPhase(_Closed):
    clients: int = Field(ge=0, description="clients in the closed loop during this phase")
    duration_s: float = Field(gt=0, allow_inf_nan=False)


class ClientsArrivals(_Closed):
    """A closed loop (``specserve bench --clients``): each client sends its next request the moment its last one
    finishes, so the offered load follows the engine's speed; the number of clients changes by phase."""

    kind: Literal["clients"]
    phases: list[ClientPhase] = Field(min_length=1, description="consecutive phases; nothing new is sent after them")

    @model_validator(mode="after")
    def _some_client(self) -> ClientsArrivals:
        if not any(phase.clients for phase in self.phases):
            raise ValueError("no phase has a client")
        return self


class TraceArrivals(_Closed):
    kind: Literal["trace"]
    path: str = Field(description="CSV with columns arrival_s, prompt_tokens, output_tokens; relative to the scenario")


Arrivals = Annotated[
    PoissonArrivals
    | PiecewiseArrivals
    | BurstArrivals
    | OscillationArrivals
    | MultiPeakArrivals
    | TraceArrivals
    | ClientsArrivals,
    Field(discriminator="kind"),
]


class LengthsConfig(_Closed):
    prompt_tokens: LengthDistribution
    output_tokens: LengthDistribution


class StreamConfig(_Closed):
    dataset: str = Field("sharegpt", description="length distributions from profiles/datasets.yaml")
    lengths: LengthsConfig | None = Field(None, description="inline lengths instead of the dataset's")
    arrivals: Arrivals


class WorkloadConfig(StreamConfig):
    batch: StreamConfig | None = Field(
        None,
        description="a second stream of requests that their clients mark as batch work (throughput, not latency), "
        "merged with the first by arrival; the class is what the speculation-aware router reads (routing.py)",
    )

    @model_validator(mode="after")
    def _one_closed_stream(self) -> WorkloadConfig:
        if self.batch is not None and any(isinstance(s.arrivals, ClientsArrivals) for s in (self, self.batch)):
            raise ValueError("a closed loop (arrivals kind 'clients') is the only stream: drop workload.batch")
        return self


class Regime(_Closed):
    start_s: float = Field(ge=0, description="requests arriving from this time on")
    mean: float = Field(ge=0, le=1, description="their mean per-token acceptance")


class SignalsConfig(_Closed):
    """Draft-side signals per drafted token (signals.SignalModel): confidence, entropy, KL(target || draft)."""

    enabled: bool = Field(
        True, description="generate them (the slo, kld and mlp policies read them); false: records carry none"
    )
    confidence_concentration: float = Field(
        4.0,
        gt=0,
        description="kappa of the Beta confidences around each position's acceptance probability; "
        "token-level corr(confidence, accepted) = 1/sqrt(kappa + 1)",
    )
    max_alternatives: float = Field(
        256.0, ge=1, description="the draft's remaining mass spreads over 1..this many tokens (log-uniform)"
    )
    kl_scale: float = Field(
        2.0, ge=0, description="mean KL(target || draft) in nats per squared miss (1 - confidence)^2; 2 is Pinsker's"
    )


class AcceptanceClass(_Closed):
    """One kind of request in a mixed workload (a copy-heavy edit, a free-form answer), drawn by its share."""

    share: float = Field(gt=0, le=1, description="fraction of requests of this kind")
    mean: float = Field(ge=0, le=1, description="its requests' mean per-token alpha")


class AcceptanceConfig(_Closed):
    mean: float = Field(ge=0, le=1, description="mean per-request alpha (e.g. TurboSpec Table 3)")
    concentration: float | None = Field(
        20.0, gt=0, description="Beta(mean*c, (1-mean)*c) spread of alpha across requests; null: every alpha = mean"
    )
    decay: float = Field(1.0, gt=0, le=1, description="alpha_j = alpha * decay**j at draft position j")
    regimes: list[Regime] = Field(default_factory=list, description="later means, by request arrival time")
    classes: list[AcceptanceClass] = Field(
        default_factory=list,
        description="kinds of requests with their own mean: each request draws its kind by share, then its alpha "
        "from Beta around that kind's mean with ``concentration``; ``mean`` must be their share-weighted mean",
    )
    signals: SignalsConfig = Field(default_factory=SignalsConfig, description="draft confidence, entropy and KL")

    @model_validator(mode="after")
    def _classes_add_up(self) -> AcceptanceConfig:
        if not self.classes:
            return self
        if self.regimes:
            raise ValueError("acceptance.classes and acceptance.regimes cannot be combined")
        if abs(sum(c.share for c in self.classes) - 1.0) > 1e-6:
            raise ValueError("acceptance.classes: shares must add up to 1")
        weighted = sum(c.share * c.mean for c in self.classes)
        if abs(weighted - self.mean) > 0.005:
            raise ValueError(f"acceptance.mean {self.mean} is not the classes' weighted mean {weighted:.3f}")
        return self


class ScaleOutConfig(_Closed):
    """Replicas that join the router during the run, as Ray Serve's autoscaler adds them."""

    at_s: float = Field(gt=0, description="when the new replicas join (simulated seconds)")
    replicas: int = Field(gt=0, description="how many of num_replicas join then; the others serve from the start")
    priors: bool = Field(
        True,
        description="a new replica starts from its peers' acceptance evidence, averaged (the controller's acceptance "
        "prior); false: from its policy's cold prior",
    )


class SloConfig(_Closed):
    max_ttft_s: float | None = Field(None, gt=0, description="time to first token cap per request")
    max_tpot_s: float | None = Field(
        None, gt=0, description="mean time per output token cap per request; also StepContext.slo_tpot_s (AdaSpec)"
    )


class MemoryConfig(_Closed):
    """Draft offload and reload (Nightjar §6; specserve.memory). Off by default: every replica keeps its draft."""

    offload: bool = Field(False, description="offload the draft under KV pressure and reload it when load drops")
    coordination: Literal["local", "planner"] = Field(
        "local",
        description="'local': each replica reloads on its own trigger; 'planner': the cluster planner grants reloads, "
        "at most a node's transfer slots at a time, by expected gain (specserve.memory.cluster_plan)",
    )
    replicas_per_node: int = Field(1, gt=0, description="replicas sharing one node's host-to-device link")
    low_free_ratio: float = Field(0.10, gt=0, lt=1, description="eta: offload below this share of free blocks")
    window_steps: int = Field(3, ge=1, description="W: steps a trigger must hold")
    reload_buffer_ratio: float = Field(0.20, ge=0, lt=1, description="reload's safety buffer, share of the pool")
    max_migrate_ratio: float = Field(
        0.30, ge=0, le=1, description="contract once this share of the extra region is live"
    )
    drain_timeout_s: float = Field(5.0, ge=0, description="then contract whatever is live")
    min_resident_s: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="dwell: no offload until the draft is resident this long after a reload",
    )
    # Nightjar App. C, Table 14, burst-spike trace (the appendix does not name the model): expand 88.95 ms, contract
    # 306.00 ms.
    expand_s: float = Field(0.089, ge=0, description="evicting the draft and growing the pool, device-local")
    contract_s: float = Field(0.306, ge=0, description="migrating live blocks and shrinking the pool, device-local")
    max_reload_s: float = Field(0.1, gt=0, description="planner: a reload at its share of the link finishes within it")
    max_concurrent_transfers: int | None = Field(None, ge=1, description="planner: fixed reload slots per node")
    min_resident: int = Field(0, ge=0, description="planner: replicas that keep their draft resident")


class RouterConfig(_Closed):
    """How arrivals are spread over the replicas (routing.py)."""

    kind: Literal["least_outstanding", "speculation_aware"] = Field(
        "least_outstanding",
        description="'least_outstanding': the replica with the fewest running + waiting requests; "
        "'speculation_aware': latency-sensitive requests to the least-loaded replica whose draft is resident, batch "
        "requests (workload.batch) to the least-loaded one whose draft is offloaded, each within max_imbalance",
    )
    max_imbalance: int = Field(
        8,
        ge=0,
        description="speculation_aware: the preferred replica may hold at most this many outstanding requests more "
        "than the least-loaded one; beyond it the request goes to the least-loaded one",
    )


class Scenario(_Closed):
    name: str
    description: str = ""
    hardware: str = Field(description="name in profiles/hardware.yaml")
    pair: str = Field(description="name in profiles/pairs.yaml")
    tp: int | None = Field(None, gt=0, description="tensor-parallel size; default: the pair's")
    num_replicas: int = Field(1, gt=0, description="engines behind the router")
    router: RouterConfig = Field(default_factory=RouterConfig, description="a mapping, or just the router's kind")
    engine: EngineConfig = Field(default_factory=EngineConfig)
    latency: LatencyConfig = Field(default_factory=LatencyConfig)
    workload: WorkloadConfig
    acceptance: AcceptanceConfig
    slo: SloConfig | None = None
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    scale_out: ScaleOutConfig | None = Field(None, description="replicas that join during the run")

    @field_validator("router", mode="before")
    @classmethod
    def _router_by_kind(cls, value: object) -> object:
        # `router: speculation_aware` is short for `router: {kind: speculation_aware}`.
        return {"kind": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _scale_out_leaves_a_replica(self) -> Scenario:
        if self.scale_out is not None and self.scale_out.replicas >= self.num_replicas:
            raise ValueError(
                f"scale_out.replicas={self.scale_out.replicas} must be fewer than num_replicas={self.num_replicas}: "
                "some replicas serve from the start"
            )
        return self

    @model_validator(mode="after")
    def _regimes_sorted(self) -> Scenario:
        starts = [regime.start_s for regime in self.acceptance.regimes]
        if starts != sorted(starts):
            raise ValueError("acceptance.regimes must be sorted by start_s")
        return self

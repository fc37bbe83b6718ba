"""vLLM engine arguments for a speculative engine under specserve's control.

Kept free of vLLM imports: the CLI and config validation build these without loading vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specserve.speculation.methods import (
    DEFAULT_METHOD,
    NGRAM_LOOKUP_MAX,
    NGRAM_LOOKUP_MIN,
    Source,
    check_draft,
    method,
)

#: Key under vLLM's ``additional_config`` that carries specserve's settings into the EngineCore
#: process, where the scheduler reads them (no environment variables, so engines can differ).
ADDITIONAL_CONFIG_KEY = "specserve"
SCHEDULER_CLS = "specserve.replicas.core.scheduler.AdaptiveKScheduler"
# Mixed into vLLM's worker class; resolving this name (not importing the module) installs the worker's patches.
WORKER_EXTENSION_CLS = "specserve.replicas.worker.extension.InstalledWorkerExtension"


class Utility:
    """The EngineCore utility methods specserve adds (``core/utilities.py``), by the name
    ``engine_core.call_utility(_async)(NAME, *args)`` takes: the one list both ends read."""

    SET_POLICY = "specserve_set_policy"
    TELEMETRY = "specserve_telemetry"
    STEP_LOG = "specserve_step_log"
    # The controller's acceptance prior for a new replica (decayed accepted and reached counts per position).
    SEED_ACCEPTANCE = "specserve_seed_acceptance"
    # The start-up checks (calibration.py): the counters they read, and the end of the calibration's dummy runs.
    CHECK_COUNTS = "specserve_check_counts"
    END_CALIBRATION = "specserve_end_calibration"
    # Elastic draft memory (elastic_draft.py): offload the draft and grow the KV pool; reload it; read its state.
    OFFLOAD_DRAFT = "specserve_offload_draft"
    RELOAD_DRAFT = "specserve_reload_draft"
    DRAFT_MEMORY = "specserve_draft_memory"
    # A controller's memory directive (grant_reload, ...), and whether a controller grants at all.
    MEMORY_DIRECTIVE = "specserve_memory_directive"
    MEMORY_COORDINATED = "specserve_memory_coordinated"


# The ``LLMConfig.experimental_configs`` key that carries the executor a CPU replica runs (engine.py).
CPU_EXECUTOR_KEY = "specserve_cpu_executor"
#: LLMConfig.experimental_configs key: the cores a replica moves its engine onto (``cpu_affinity.py``).
ENGINE_CPUS_KEY = "specserve_engine_cpus"
#: LLMConfig.experimental_configs key: the memory parameters a replica starts the cluster's controller with, where it
#: is the first to ask (server.py; a running controller keeps its own).
CONTROLLER_KEY = "specserve_controller"
#: LLMConfig.experimental_configs key: what a replica does with its start-up checks (``speculation.startup_checks``).
STARTUP_CHECKS_KEY = "specserve_startup_checks"

# The engine path on a GPU. vLLM 0.32 would run Model Runner V2 wherever Triton works, whose draft-model speculator
# runs every draft step whatever k the scheduler asks (vllm/v1/worker/gpu/spec_decode/standalone_ar/speculator.py),
# and async scheduling for draft models, under which EngineCore hands the scheduler no draft tokens and the k = 0
# skip is off. specserve runs the V1 model runner with synchronous scheduling, the code vLLM's CPU runner shares and
# the tests run; the scheduler checks both at start (engine_path.py). The cost: the CPU's scheduling of a step no
# longer overlaps the GPU's previous step.
GPU_ENGINE_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
GPU_ENGINE_KWARGS = {"async_scheduling": False}
# What one entry of the step log holds (``StepRecord`` fields).
STEP_LOG_FIELDS = (
    "now_s",
    "k",
    "duration_s",
    "num_running",
    "num_context_tokens",
    "num_batched_tokens",
    "num_draft_passes",
    "num_emitted_tokens",
    "forward_s",
    "draft_s",
)


@dataclass(frozen=True, slots=True)
class DraftOffload:
    """Nightjar's offload triggers as the user set them (the rest: ``specserve.memory.ResidencyParams``)."""

    low_free_ratio: float = 0.10
    window_steps: int = 3
    min_resident_s: float = 0.0


@dataclass(frozen=True, slots=True)
class EngineControlConfig:
    """What the EngineCore-side scheduler needs to know at start."""

    # Initial policy spec, e.g. "adaptive" or "fixed:k=3".
    policy: str
    # Skip the draft's forward pass on k = 0 decode steps (specserve.speculation.draft_sync); the next pass
    # catches up the requests whose draft KV then has a hole. False: vLLM's own behaviour.
    skip_k0_draft_pass: bool = True
    # Most tokens one step's draft pass prepends to catch lagging requests' draft KV up (draft_sync.catch_up_plan);
    # None: k0_skip.catch_up_cap's device default.
    catch_up_max_tokens: int | None = None
    # Modules the scheduler imports before building the policy: where user policies register themselves.
    policy_modules: tuple[str, ...] = ()
    # Elastic draft memory under Nightjar's triggers (elastic_draft.py); None: offload only when asked.
    draft_offload: DraftOffload | None = None
    # The draft's confidence and entropy per drafted token, computed from its logits in the worker
    # (draft_signals.py) for the policies that read them; false saves a softmax over the vocabulary per pass.
    draft_signals: bool = True
    # A file every step is appended to as one JSON line (the policy's context and what the step ran), for replaying
    # the policy's decisions offline (``lab/studies/policy_replay/policy_replay.py``); None: no log.
    step_log: str | None = None

    def to_additional_config(self) -> dict[str, Any]:
        offload = self.draft_offload
        return {
            "policy": self.policy,
            "skip_k0_draft_pass": self.skip_k0_draft_pass,
            "catch_up_max_tokens": self.catch_up_max_tokens,
            "policy_modules": list(self.policy_modules),
            "draft_offload": (
                None if offload is None else [offload.low_free_ratio, offload.window_steps, offload.min_resident_s]
            ),
            "draft_signals": self.draft_signals,
            "step_log": self.step_log,
        }

    @classmethod
    def from_additional_config(cls, data: dict[str, Any] | None) -> EngineControlConfig:
        if not data:
            raise ValueError(
                f"additional_config[{ADDITIONAL_CONFIG_KEY!r}] is missing: build engine arguments with "
                "specserve.replicas.config.engine_args.speculative_engine_kwargs"
            )
        return cls(
            policy=str(data["policy"]),
            skip_k0_draft_pass=bool(data.get("skip_k0_draft_pass", True)),
            catch_up_max_tokens=data.get("catch_up_max_tokens"),
            policy_modules=tuple(data.get("policy_modules", ())),
            draft_offload=DraftOffload(*data["draft_offload"]) if data.get("draft_offload") else None,
            draft_signals=bool(data.get("draft_signals", True)),
            step_log=data.get("step_log"),
        )


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """A target/draft pair and the engine sizes, resolved from user config."""

    target: str
    # The draft model or head (``speculation.draft``); None for methods without one (``methods.Source``).
    draft: str | None
    policy: str
    max_k: int
    # vLLM's ``speculative_config.method`` (``specserve.speculation.methods``).
    method: str = DEFAULT_METHOD
    max_model_len: int = 512
    max_num_seqs: int = 8
    tensor_parallel_size: int = 1
    dtype: str = "bfloat16"
    # CUDA graphs on GPU; on CPU eager mode avoids a ~35 s torch.compile at start.
    enforce_eager: bool = True
    seed: int = 0
    # Output tokens per streamed chunk (vLLM's stream_interval): fewer chunks through every serving hop.
    stream_interval: int = 1
    # See EngineControlConfig.skip_k0_draft_pass.
    skip_k0_draft_pass: bool = True
    # See EngineControlConfig.catch_up_max_tokens.
    catch_up_max_tokens: int | None = None
    # See EngineControlConfig.policy_modules.
    policy_modules: tuple[str, ...] = ()
    # See EngineControlConfig.draft_offload.
    draft_offload: DraftOffload | None = None
    # See EngineControlConfig.draft_signals.
    draft_signals: bool = True
    # See EngineControlConfig.step_log.
    step_log: str | None = None
    extra: tuple[tuple[str, Any], ...] = ()


def speculative_engine_kwargs(spec: EngineSpec) -> dict[str, Any]:
    """Keyword arguments for vLLM's ``AsyncEngineArgs`` / ``LLM`` / Ray's ``LLMConfig.engine_kwargs``."""
    # A proposer without logits (lookup) has no confidences to read: the worker's wrapper would wait for none.
    signals = spec.draft_signals and method(spec.method).has_draft_logits
    kwargs: dict[str, Any] = dict(
        model=spec.target,
        tokenizer=spec.target,
        dtype=spec.dtype,
        max_model_len=spec.max_model_len,
        max_num_seqs=spec.max_num_seqs,
        tensor_parallel_size=spec.tensor_parallel_size,
        enforce_eager=spec.enforce_eager,
        seed=spec.seed,
        stream_interval=spec.stream_interval,
        disable_log_stats=False,
        scheduler_cls=SCHEDULER_CLS,
        worker_extension_cls=WORKER_EXTENSION_CLS,
        additional_config={
            ADDITIONAL_CONFIG_KEY: EngineControlConfig(
                policy=spec.policy,
                skip_k0_draft_pass=spec.skip_k0_draft_pass,
                catch_up_max_tokens=spec.catch_up_max_tokens,
                policy_modules=spec.policy_modules,
                draft_offload=spec.draft_offload,
                draft_signals=signals,
                step_log=spec.step_log,
            ).to_additional_config()
        },
        speculative_config=speculative_config(spec.method, spec.draft, spec.max_k, spec.max_num_seqs),
    )
    kwargs.update(dict(spec.extra))
    return kwargs


def speculative_config(name: str, draft: str | None, max_k: int, max_num_seqs: int) -> dict[str, Any]:
    """vLLM's ``speculative_config`` for method ``name`` under specserve's per-step k."""
    m = method(name)
    config: dict[str, Any] = {
        "method": name,
        # The maximum k: sizes buffers and KV lookahead. The policy picks 0..max_k each step.
        "num_speculative_tokens": max_k,
        # A (flat) batch-size table makes vLLM stop padding new decodes to 1 + max_k tokens;
        # the scheduler overrides the table's value every step anyway.
        "num_speculative_tokens_per_batch_size": [[1, max_num_seqs, max_k]],
    }
    check_draft(m, draft)
    if draft is not None:
        config["model"] = draft
    if m.source is Source.NONE and name == "ngram":
        config.update(prompt_lookup_max=NGRAM_LOOKUP_MAX, prompt_lookup_min=NGRAM_LOOKUP_MIN)
    return config


# What ``speculative_engine_kwargs`` adds to vLLM's arguments for specserve's own scheduler, worker and policy.
SPECSERVE_KWARGS = ("scheduler_cls", "worker_extension_cls", "additional_config")


def plain_vllm_kwargs(spec: EngineSpec, *, speculative: bool) -> dict[str, Any]:
    """The same engine as vLLM ships it, for baselines: vLLM's own scheduler and worker, with the draft at a fixed
    ``num_speculative_tokens = spec.max_k`` or (``speculative=False``) no speculation at all."""
    kwargs = speculative_engine_kwargs(spec)
    for key in SPECSERVE_KWARGS if speculative else ("speculative_config", *SPECSERVE_KWARGS):
        kwargs.pop(key)
    return kwargs

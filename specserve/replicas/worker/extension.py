"""Worker side of "k = 0 is really off": skip the draft's forward pass on k = 0 decode steps (vLLM 0.32.0).

vLLM's drafter runs in the worker process(es), which the scheduler module cannot reach, so vLLM resolves
``worker_extension_cls`` (``engine_args.WORKER_EXTENSION_CLS``, the name ``INSTALLED`` below) there, and resolving it
runs ``install``: this module's patch and those of ``plain_step``, ``draft_signals``, ``sampler_guard``,
``step_timing`` and ``shape_warmup``. Importing the module installs nothing. ``install`` wraps
``GPUModelRunner.propose_draft_token_ids`` (``CPUModelRunner`` inherits it): when the step's plan, which the
scheduler decided and attached to the step's ``SchedulerOutput`` (``signalled_drafts.step_plan``), says to skip the
pass, the wrapper returns no drafts without running the draft: an empty list per request (the proposer's own k = 0
return is an empty ``(num_reqs, 0)`` tensor; the list form spares vLLM's device-to-host copy of it, and the scheduler
does not fetch it at all, ``core/utilities._post_step``). Every other step goes to vLLM's method unchanged.
Tensor-parallel ranks receive the same ``SchedulerOutput``, plan included, so they skip together and no collective is
left waiting.

Private vLLM interfaces touched (paths under ``vllm/``, vLLM 0.32.0):

- ``v1/worker/gpu_model_runner.py:4748`` ``GPUModelRunner.propose_draft_token_ids(scheduler_output,
  sampled_token_ids, ...)``: wrapped; called from ``sample_tokens`` (4365) on the padded drafter path.
- ``GPUModelRunner._draft_probs`` / ``_draft_prob_req_ids``: reset to None on a skip, as the method does.
- ``GPUModelRunner.input_batch.req_ids``, ``.device``, ``.vllm_config``: read.
- ``SchedulerOutput``: the plan's attribute (``signalled_drafts.PLAN_ATTR``); ``VllmConfig`` fields, read through
  ``k0_skip`` (listed there).
- ``v1/spec_decode/llm_base_proposer.py:620``: the k = 0 early return whose result a skip reproduces.
- ``v1/worker/gpu_model_runner.py:4633`` ``_copy_draft_token_ids_to_cpu``: returns before its copy for list
  drafts (synchronous scheduling; skipping is off under async scheduling, whose path reads the tensor).
- ``v1/worker/worker_base.py:296``: ``worker_extension_cls`` is resolved (``import_module`` then ``getattr``) in the
  worker, which then appends the class to its worker class's bases and never calls its ``__init__``: resolving the
  name is the one moment the worker's code is ours before it builds its model runner and loads the weights.

Catch-up (``_propose_with_catch_up``, wrapped around this runner's ``drafter.propose``): on a step whose plan
catches requests up, the pass gets each one's missed tokens (``DraftPassPlan.catch_up``, from its first stale position
``first_stale``) in front of its part of the draft's first pass; a request caught up in part (``partial``) gets its
chunk in place of its part. The worker keeps no draft-KV bookkeeping: the scheduler's ``DraftKVTracker`` made the plan
and follows it. Interfaces touched for it:

- ``v1/spec_decode/llm_base_proposer.py:512`` ``SpecDecodeBaseProposer.propose(...)``, keyword call from the
  runner (5006): ``target_token_ids``, ``target_positions``, ``target_hidden_states``,
  ``common_attn_metadata``, ``num_rejected_tokens_gpu`` rewritten or read. ``set_inputs_first_pass`` (817)
  then derives slots from positions and the block table, so prepended positions land in their own slots.
- ``v1/attention/backend.py:387`` ``CommonAttentionMetadata``: ``query_start_loc(_cpu)``,
  ``num_actual_tokens``, ``max_query_len`` grown through ``replace``; ``seq_lens`` unchanged (the query
  only reaches back) except for a row caught up in part, whose sequence ends at its chunk (and
  ``seq_lens_cpu_upper_bound`` with it, where set; its ``num_rejected_tokens_gpu`` entry set to 0); the
  cached ``_num_computed_tokens_cache`` / ``_token_to_req_indices_cache`` cleared. ``v1/spec_decode/utils.py``
  ``compute_new_slot_mapping`` (363) sizes the pass to the query lengths plus one slot per request.
- ``GPUModelRunner.input_batch.token_ids_cpu`` (the missed tokens' ids), ``.req_ids``,
  ``discard_request_mask.np`` (which rows sample a token this step, runner 2058),
  ``vllm_config.scheduler_config.max_num_batched_tokens`` (the draft's buffers are sized to it, the one
  extra slot per request included: ``draft_sync.draft_pass_room``, which the scheduler's plan respects).
- ``SpecDecodeBaseProposer.method``: catch-up only for ``draft_model``, whose draft reads token ids alone.
- ``GPUModelRunner.speculative_config.method``: read, for whether a proposal must be exactly k wide
  (``specserve.speculation.methods.Method.exact_width``).

What a skip leaves out besides the draft forward: ``prepare_next_token_ids_padded`` and
``_copy_valid_sampled_token_count``, which only matter under async scheduling (runner 938);
``k0_skip.skipping_enabled`` turns skipping off there.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import torch
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from specserve.replicas import vllm_hooks
from specserve.replicas.draft_memory import worker as draft_memory
from specserve.replicas.k0_skip import runner_skips
from specserve.replicas.signalled_drafts import step_plan
from specserve.replicas.worker import draft_signals, plain_step, sampler_guard, shape_warmup, step_timing
from specserve.speculation.draft_sync import DraftPassPlan
from specserve.speculation.methods import method

# Per worker process: draft passes skipped and run, requests caught up and their tokens, read by tests
# and telemetry through ``collective_rpc``.
_counts = {"skipped": 0, "ran": 0, "caught_up": 0, "catch_up_tokens": 0, "proposals": 0, "proposals_not_k": 0}
# Per pass that ran on this worker: (requests, catch-up tokens, seconds in the drafter's propose), the raw
# material of the catch-up cost profile (lab/studies/catch_up/catch_up_cost.py).
_propose_times: deque[tuple[int, int, float]] = deque(maxlen=4096)
# Whether this runner's drafter.propose is wrapped for catch-up (False: a drafter that cannot catch up).
_CATCH_UP_ATTR = "_specserve_catch_up"
# The draft rebuild under way (draft_memory.DraftLoader), if any.
_LOADER_ATTR = "_specserve_draft_loader"
_STEP_ATTR = "_specserve_scheduler_output"


TARGETS = ("vllm.v1.worker.gpu_model_runner:GPUModelRunner.propose_draft_token_ids",)
# Every patch the worker needs, this module's last.
_PATCHES = (plain_step, draft_signals, sampler_guard, step_timing, shape_warmup)
# vLLM's method, kept by ``install``.
_original_propose: Any = None


def _propose_or_skip(
    self: GPUModelRunner, scheduler_output: SchedulerOutput, *args: Any, **kwargs: Any
) -> list[list[int]] | torch.Tensor:
    if not step_plan(scheduler_output).skip:
        _counts["ran"] += 1
        if runner_skips(self):
            _install_catch_up(self, scheduler_output)
        draft_signals.begin(self)
        started = time.perf_counter()
        try:
            drafts = _original_propose(self, scheduler_output, *args, **kwargs)
            _count_proposal(drafts, scheduler_output.num_spec_tokens_to_schedule, _exact_width(self))
            return drafts
        finally:
            step_timing.add_draft_seconds(time.perf_counter() - started)
            draft_signals.end(self)
    _counts["skipped"] += 1
    draft_signals.clear(self)
    self._draft_probs = None
    self._draft_prob_req_ids = None
    # No drafts, as a list: vLLM then skips its device-to-host copy of them (the copy, its stream and event
    # are a few percent of a 2-3 ms CPU step), and the scheduler does not fetch them (utilities._post_step).
    return [[] for _ in self.input_batch.req_ids]


_EXACT_ATTR = "_specserve_exact_width"


def _exact_width(runner: GPUModelRunner) -> bool:
    """Whether the engine's method drafts exactly k (a model) or up to k (a lookup finds what it finds); read from
    the config once per runner, as ``k0_skip.runner_skips`` is, since it is asked every drafting step."""
    exact = getattr(runner, _EXACT_ATTR, None)
    if exact is None:
        exact = method(runner.speculative_config.method).exact_width
        setattr(runner, _EXACT_ATTR, exact)
    return exact


def _count_proposal(drafts: list[list[int]] | torch.Tensor, k: int, exact: bool = True) -> None:
    """A proposal and whether it was as wide as its step's k (``exact``), or no wider (a lookup's): the start-up
    check ``k_honoured`` reads these (``specserve.speculation.startup_checks``)."""
    if isinstance(drafts, torch.Tensor):
        width = int(drafts.shape[-1]) if drafts.dim() == 2 and drafts.shape[0] > 0 else None
    else:
        width = max((len(d) for d in drafts), default=None)
    if width is None:
        return
    _counts["proposals"] += 1
    _counts["proposals_not_k"] += int(width != k if exact else width > k)


def _install_catch_up(runner: GPUModelRunner, scheduler_output: SchedulerOutput) -> None:
    setattr(runner, _STEP_ATTR, scheduler_output)
    if getattr(runner, _CATCH_UP_ATTR, None) is not None:
        return
    drafter = runner.drafter
    if getattr(drafter, "method", None) != "draft_model":
        # An EAGLE-style draft reads the target's hidden states, which a skipped step never kept.
        setattr(runner, _CATCH_UP_ATTR, False)
        return
    setattr(runner, _CATCH_UP_ATTR, True)
    original = drafter.propose

    def propose(**kwargs: Any) -> torch.Tensor:
        return _propose_with_catch_up(runner, original, kwargs)

    drafter.propose = propose


def _propose_with_catch_up(runner: GPUModelRunner, original: Any, kwargs: dict[str, Any]) -> torch.Tensor:
    plan: DraftPassPlan = step_plan(getattr(runner, _STEP_ATTR))
    req_ids = list(runner.input_batch.req_ids)
    if plan.catch_up:
        bounds = kwargs["common_attn_metadata"].query_start_loc_cpu[: len(req_ids) + 1].tolist()
        extra = [plan.catch_up.get(r, 0) for r in req_ids]
        partial = [r in plan.partial for r in req_ids]
        firsts = [plan.first_stale.get(r, 0) for r in req_ids]
        kwargs = _prepend_missed_tokens(runner, kwargs, bounds, firsts, extra, partial)
        _counts["caught_up"] += len(plan.catch_up) - len(plan.partial)
        _counts["catch_up_tokens"] += sum(plan.catch_up.values())
    started = time.perf_counter()
    result = original(**kwargs)
    _propose_times.append((len(req_ids), sum(plan.catch_up.values()), time.perf_counter() - started))
    return result


def _prepend_missed_tokens(
    runner: GPUModelRunner,
    kwargs: dict[str, Any],
    bounds: list[int],
    firsts: list[int],
    extra: list[int],
    partial: list[bool],
) -> dict[str, Any]:
    """The pass's inputs with each row's missed positions ``[first, first + extra)`` (``first``: its first stale
    position) in front of its tokens. A row caught up in part (``partial``) gets the chunk instead of its tokens:
    its query is the chunk, its sequence ends there (``seq_lens``), none of it counts as rejected, and what the
    pass then drafts for it is cut by the scheduler, since it still lags."""
    token_ids, positions, hidden = (
        kwargs["target_token_ids"],
        kwargs["target_positions"],
        kwargs["target_hidden_states"],
    )
    cad = kwargs["common_attn_metadata"]
    device = token_ids.device
    ids_parts, pos_parts, hidden_parts = [], [], []
    grown = []  # each row's query length, after less before
    chunked = [i for i, p in enumerate(partial) if p]
    seq_lens = cad.seq_lens.clone() if chunked else cad.seq_lens
    for i, n in enumerate(extra):
        lo, hi = bounds[i], bounds[i + 1]
        first = firsts[i]
        if n:
            missed = runner.input_batch.token_ids_cpu[i, first : first + n]
            ids_parts.append(torch.as_tensor(missed, dtype=token_ids.dtype).to(device))
            pos_parts.append(torch.arange(first, first + n, dtype=positions.dtype, device=device))
            hidden_parts.append(hidden.new_zeros((n, *hidden.shape[1:])))
        if partial[i]:
            seq_lens[i] = first + n
            grown.append(n - (hi - lo))
            continue
        ids_parts.append(token_ids[lo:hi])
        pos_parts.append(positions[lo:hi])
        hidden_parts.append(hidden[lo:hi])
        grown.append(n)
    shift = torch.tensor([0, *grown], dtype=cad.query_start_loc_cpu.dtype).cumsum(0)
    starts_cpu = cad.query_start_loc_cpu.clone()
    starts_cpu[: len(shift)] += shift
    starts_cpu[len(shift) :] += shift[-1]  # padding rows, if any, keep their (empty) queries at the end
    query_lens = starts_cpu[1:] - starts_cpu[:-1]
    total = int(shift[-1])
    replaced: dict[str, Any] = {}
    if chunked:
        replaced["seq_lens"] = seq_lens
        upper = getattr(cad, "seq_lens_cpu_upper_bound", None)
        if upper is not None:
            upper = upper.clone()
            upper[chunked] = torch.tensor([firsts[i] + extra[i] for i in chunked], dtype=upper.dtype)
            replaced["seq_lens_cpu_upper_bound"] = upper
    new_cad = cad.replace(
        query_start_loc=starts_cpu.to(cad.query_start_loc.device),
        query_start_loc_cpu=starts_cpu,
        num_actual_tokens=cad.num_actual_tokens + total,
        max_query_len=int(query_lens.max()),
        _num_computed_tokens_cache=None,
        _token_to_req_indices_cache=None,
        **replaced,
    )
    out = {
        **kwargs,
        "target_token_ids": torch.cat(ids_parts),
        "target_positions": torch.cat(pos_parts),
        "target_hidden_states": torch.cat(hidden_parts),
        "common_attn_metadata": new_cad,
    }
    rejected = kwargs.get("num_rejected_tokens_gpu")
    if rejected is not None and chunked:
        rejected = rejected.clone()
        rejected[chunked] = 0
        out["num_rejected_tokens_gpu"] = rejected
    return out


def install() -> None:
    """Install every patch the worker needs, once per process (later calls change nothing)."""
    global _original_propose
    for module in _PATCHES:
        module.install()
    _original_propose = vllm_hooks.replace(TARGETS[0], _propose_or_skip)


class DraftSkipWorkerExtension:
    """Mixed into vLLM's worker class; its methods are callable with ``collective_rpc``."""

    def specserve_draft_pass_counts(self) -> dict[str, int]:
        """Draft passes this worker skipped and ran (``propose_draft_token_ids`` calls), requests it caught
        up and the missed tokens it fed the draft, and skipped steps it ran as plain steps, since it started."""
        return {**_counts, **plain_step.counts}

    def specserve_propose_times(self) -> list[tuple[int, int, float]]:
        """The latest passes' (requests, catch-up tokens, propose seconds), oldest first; then forgets them."""
        out = list(_propose_times)
        _propose_times.clear()
        return out

    # -- elastic draft memory (draft_memory/worker.py); the EngineCore calls these between two steps -------------

    def specserve_kv_layout(self) -> dict[str, int]:
        runner = self.model_runner  # type: ignore[attr-defined]
        return {**draft_memory.kv_layout(runner), "draft_resident": int(draft_memory.draft_resident(runner))}

    def specserve_drop_draft(self) -> dict[str, float]:
        runner = self.model_runner  # type: ignore[attr-defined]
        return draft_memory.drop_draft(runner)

    def specserve_begin_reload(self) -> None:
        """Start rebuilding the draft in the background; ``specserve_reload_state`` tells when it is built."""
        runner = self.model_runner  # type: ignore[attr-defined]
        setattr(runner, _LOADER_ATTR, draft_memory.begin_restore(runner))

    def specserve_reload_state(self) -> str:
        """``loading``, ``ready`` or ``failed``: the background rebuild's progress (``idle`` when none runs)."""
        loader = getattr(self.model_runner, _LOADER_ATTR, None)  # type: ignore[attr-defined]
        return loader.state if loader is not None else "idle"

    def specserve_finish_reload(self) -> dict[str, float]:
        """Swap the rebuilt draft in (waiting for the build if it is still running); raises if it failed."""
        runner = self.model_runner  # type: ignore[attr-defined]
        loader = getattr(runner, _LOADER_ATTR, None)
        if loader is None:
            raise RuntimeError("no draft reload is under way")
        setattr(runner, _LOADER_ATTR, None)
        return loader.adopt()

    def specserve_migrate_blocks(self, moves: list[tuple[int, int]]) -> dict[str, float]:
        return draft_memory.migrate_blocks(self.model_runner, moves)  # type: ignore[attr-defined]

    def specserve_resize_kv(self, num_blocks: int, lend_draft_kv: bool = False, capacity: int = 0) -> dict[str, float]:
        runner = self.model_runner  # type: ignore[attr-defined]
        return draft_memory.resize_kv(runner, num_blocks, lend_draft_kv, capacity)


#: The name ``worker_extension_cls`` resolves (``engine_args.WORKER_EXTENSION_CLS``): the extension class, once the
#: worker's patches are installed.
INSTALLED = "InstalledWorkerExtension"


def __getattr__(name: str) -> type[DraftSkipWorkerExtension]:
    # Module-level __getattr__ (PEP 562) answers only names the module does not define, so a plain import, or an
    # import of the class by its own name, installs nothing; vLLM's worker resolves ``INSTALLED`` (see above).
    if name == INSTALLED:
        install()
        return DraftSkipWorkerExtension
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The messages that cross the policy boundary.

The engine (``specserve.replicas``) and the simulator build these records; policies only read them.
They are plain frozen dataclasses so the same policy code runs everywhere and can be unit-tested on
synthetic records.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol


@dataclass(frozen=True, slots=True)
class EngineTraits:
    """What the engine under a policy can do; fixed for the engine's lifetime."""

    # Largest k the engine was started with: it sizes vLLM's buffers and KV lookahead.
    max_k: int
    # vLLM's k=0 still runs one draft forward pass per step to keep the draft's KV cache in sync, so
    # "speculation off" is not free there. A policy's cost model must charge that pass.
    k0_runs_draft_pass: bool = True
    # Where k = 0 skips the pass: seconds per token of the draft's catch-up when k > 0 resumes (a run of m
    # skipped steps leaves m - 1 tokens per request to catch up). Measured per engine (the CPU profile in
    # replicas/, the draft's forward cost in the simulator); None: not known, policies fall back to their own.
    resume_s_per_token: float | None = None
    # The draft loop asks the step's ``Decision.draft_stop`` after every pass, with the pass's draft confidence
    # (the simulator with draft signals on). vLLM's draft loop cannot be stopped from the scheduler: see
    # ``verifies_confident_prefix``.
    asks_stop_drafting: bool = False
    # The engine reads each draft's confidence before verifying it and asks ``Decision.draft_stop`` position by
    # position, verifying only the prefix up to the stop (``confident_prefix``): vLLM, whose drafts are proposed a
    # step ahead of their verification. The draft passes have run by then; the rule saves verification only.
    verifies_confident_prefix: bool = False
    # The drafts a step verifies were made by the step before, at that step's k (vLLM: the draft proposes at the end
    # of a step for the next). A step at k verifies min(k, the k before) drafts per request: a rise in k pays its
    # passes one step before its drafts are verified, and a single step at a higher k verifies none of its own.
    drafts_ahead: bool = False
    # The target verifies by vLLM V0's batch expansion: position j of each request is scored as its own sequence,
    # so a step with k drafts reads every request's KV k + 1 times (AdaSpec §4.1, Eq. 4). vLLM V1 scores all
    # positions in one pass.
    batch_expansion: bool = False
    # The proposer finds all k drafts in one pass whatever k is (n-gram prompt lookup searches the request's tokens
    # once), so a step at k > 0 runs one proposer pass, not k (``speculation.methods``: a method without weights).
    one_proposer_pass: bool = False


@dataclass(frozen=True, slots=True)
class StepContext:
    """What the scheduler knows when it asks for k, before the step runs."""

    # Monotonic seconds; policies time their cool-downs and probes from it, never from loop counts.
    now_s: float
    # Requests that will decode this step (the decode batch size B).
    num_running: int
    # Requests queued and not yet admitted; a load signal.
    num_waiting: int
    # Tokens already in the KV cache over the running requests: attention reads all of them.
    num_context_tokens: int
    # Prompt tokens scheduled this step (chunked prefill), which the target processes besides decodes.
    num_prefill_tokens: int = 0
    num_kv_blocks_free: int = 0
    num_kv_blocks_total: int = 0
    # False while the draft's weights are off the device: the policy must then pick k=0.
    draft_resident: bool = True
    # Ids of the running requests, for policies that keep per-request state (DSDE's per-sequence
    # k, AdaSpec's per-request trimming). Empty where the engine does not expose them.
    request_ids: tuple[str, ...] = ()
    # Time-per-output-token target in seconds (AdaSpec's SLO); None when the deployment has none.
    slo_tpot_s: float | None = None
    # New KV blocks the decoding requests need this step at k = 0, 1, ..., max_k (index k), to compare with
    # ``num_kv_blocks_free``: a k whose blocks do not fit preempts a running request, which recomputes its whole
    # context later. Empty where every k fits (``context.kv_blocks_needed``) or the engine does not say.
    kv_blocks_needed: tuple[int, ...] = ()


class DraftStop(Protocol):
    """One step's rule for ending its draft loop early; a policy hands it out with the step's ``Decision``."""

    def after_pass(self, position: int, confidence: float) -> bool:
        """The draft pass at 0-based ``position`` ran: stop drafting now?

        ``confidence`` is the batch mean of the draft's probability of the token it drafted at that position.
        True keeps the drafts made so far and runs no further pass. The engine calls it once per pass, in order.
        """
        ...


@dataclass(frozen=True, slots=True)
class Decision:
    """A policy's answer for one step."""

    # Draft tokens to verify per request this step; 0 means no speculation.
    k: int
    # Optional per-request caps below k (request id -> max drafts), for per-sequence policies. The simulator
    # honours them; the vLLM engine cuts each capped request's drafts before verification.
    max_k_per_request: tuple[tuple[str, int], ...] = ()
    # This step's early-stop rule, asked after every draft pass where the engine can stop its loop
    # (``EngineTraits.asks_stop_drafting``), or after each position of the drafts about to be verified where it
    # cannot (``verifies_confident_prefix``); None drafts and verifies all k. It carries whatever state the rule
    # needs, so the policy keeps none between ``choose`` and the draft loop.
    draft_stop: DraftStop | None = None


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one engine step did, measured after it ran."""

    now_s: float
    # The k the policy chose for this step.
    k: int
    # Wall time of the step: from the previous step's end when the engine went straight on from it (the
    # loop's work between steps is part of what a step costs), else from its schedule; to its output processed.
    duration_s: float
    num_running: int
    num_context_tokens: int
    # Tokens the target model processed this step: decodes, verified drafts and prefill chunks.
    num_batched_tokens: int
    # Draft-model forward passes run this step (k, or 1 when k=0 still syncs the draft's KV).
    num_draft_passes: int
    # Tokens appended to outputs this step (accepted drafts plus one bonus/correction per request).
    num_emitted_tokens: int
    # Per speculating request, aligned: drafts it verified and how many of those were accepted. The
    # accepted ones are always a prefix, so per-position counts derive from these two tuples exactly.
    num_drafted_per_request: tuple[int, ...] = field(default=())
    num_accepted_per_request: tuple[int, ...] = field(default=())
    # Optional draft-side signals, aligned with the per-request tuples above, one value per drafted
    # position. The simulator generates them consistently with acceptance; the vLLM engine reads confidence
    # and entropy from the draft's logits (kl stays empty there). Confidence is the draft's probability of the
    # token it drafted (AdaSpec, SpecKV); entropy is the draft distribution's entropy in nats (SpecKV); kl is
    # KL(target || draft) at that position in nats (DSDE).
    request_ids: tuple[str, ...] = field(default=())
    draft_confidence_per_request: tuple[tuple[float, ...], ...] = field(default=())
    draft_entropy_per_request: tuple[tuple[float, ...], ...] = field(default=())
    kl_per_request: tuple[tuple[float, ...], ...] = field(default=())
    # The step's parts, timed where they run: seconds in the target's pass (inputs, forward, logits) and in the
    # draft's passes (0.0 when none ran). None where not measured; the rest of ``duration_s`` is the loop's own
    # work (scheduling, sampling, output processing). The vLLM engine times them in the worker, the simulator
    # reports its step model's terms.
    forward_s: float | None = None
    draft_s: float | None = None

    def __post_init__(self) -> None:
        if len(self.num_drafted_per_request) != len(self.num_accepted_per_request):
            raise ValueError("drafted and accepted per-request tuples must be aligned")

    @property
    def num_drafted(self) -> int:
        return sum(self.num_drafted_per_request)

    @property
    def num_accepted(self) -> int:
        return sum(self.num_accepted_per_request)

    def per_position(self, max_k: int) -> tuple[list[int], list[int], list[int]]:
        """(drafted, reached, accepted) per position 0..max_k-1.

        ``reached[j]`` counts drafts at position j whose whole prefix was accepted: the only ones whose
        verdict says anything about position j, so ``accepted[j] / reached[j]`` is the conditional
        acceptance rate at j that TurboSpec's Eq. 4 needs (prefix-accepted / proposed under-estimates it).
        """
        # A request counts at every position below its number: drafts made, drafts up to and including the first
        # rejected one (min(d, a + 1)), drafts accepted. Counting each number once is O(B + k), not O(B k); the three
        # histograms fill in one pass over the requests (the simulator's hot path).
        top = max_k
        drafted, reached, accepted = [0] * (top + 1), [0] * (top + 1), [0] * (top + 1)
        for d, a in zip(self.num_drafted_per_request, self.num_accepted_per_request, strict=True):
            r = d if d <= a + 1 else a + 1
            drafted[d if d < top else top] += 1
            reached[r if r < top else top] += 1
            accepted[a if a < top else top] += 1
        return _above(drafted), _above(reached), _above(accepted)


def _above(histogram: list[int]) -> list[int]:
    """Per position 0..len - 2, how many of the histogram's numbers exceed it (the last bin: max_k and above)."""
    max_k = len(histogram) - 1
    out, above = [0] * max_k, 0
    for pos in range(max_k - 1, -1, -1):
        above += histogram[pos + 1]
        out[pos] = above
    return out


def without_acceptance(record: StepRecord) -> StepRecord:
    """``record`` with what it says of acceptance left out: its cost (k, batch, tokens, time) only. A policy
    warm-started from dummy steps learns what they cost, never how dummy prompts accept."""
    return replace(
        record,
        num_drafted_per_request=(),
        num_accepted_per_request=(),
        request_ids=(),
        draft_confidence_per_request=(),
        draft_entropy_per_request=(),
        kl_per_request=(),
    )

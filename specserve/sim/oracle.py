"""``oracle``: a simulator-only policy that knows what every real policy has to estimate.

A real policy learns each request's acceptance and the step cost from the steps it observes. The simulator *is*
those two things: each request's true alpha (true_acceptance.py) and the step timer (latency.py). The oracle
reads both, and the replica's own batch and queue, and before every step prices each batch-wide k = 0..max_k
exactly as the replica will schedule and price it:

- the grant the replica's ``_grant`` makes at that k: decodes ask 1 + k tokens, prefill chunks the rest of the
  token budget in row order, then waiting requests are admitted into what budget, seats and KV are left;
  a k whose new KV blocks do not fit the free ones (so it would preempt) is not a candidate unless k = 0
  does not fit either;
- its expected tokens: per decoding request with true alpha a and d granted drafts,
  ``1 + sum_{j=1..d} prod_{m<j} a * decay**m``: draft m is accepted with probability ``a * decay**m`` and the
  target keeps the accepted prefix plus one token (the chain model of true_acceptance.py; TurboSpec Eq. 4 when
  decay = 1);
- its time: the true ``StepTimer`` over the step's context, batched tokens and draft passes (the first pass
  carries the step's new tokens and the draft's catch-up, each further pass one token per request still
  drafting; batch-expansion scorers read the extra context, AdaSpec §4.1 Eq. 4).

It picks the k with the most expected decode tokens per second of decode time; ties go to the smaller k. The
decode time is the step's time minus what its prefill chunk costs beyond the fixed cost of a forward pass
(``prefill_at_margin``), as ``adaptive`` charges it: a chunk rides along whatever k is, and charging it whole to
the decodes makes drafts look like they amortise it (goodput.py's docstring on an overloaded 4090). For a fixed
batch, the most tokens per decode second is the least time per output token.

What it does not do, so that its distance from a deployable policy measures estimation and not a larger action
space: one k for the whole batch (no per-request caps, which the vLLM engine does not apply either), no early
stop of the draft loop (``adaptive`` has one where the engine asks; so it can beat the oracle), no look-ahead
(each step is priced on its own: the draft's catch-up after a k = 0 step with no draft pass, and the preemptions
a k's KV growth causes in later steps, are not weighed), and no knowledge of the verdicts themselves, only
their probabilities.

The vLLM engine refuses the name (``specserve.speculation.policy.SIMULATOR_ONLY``): it has no such truth.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING

import numpy as np

from specserve.sim.batch import RequestTable
from specserve.sim.latency import StepTimer
from specserve.sim.true_acceptance import TrueAcceptance
from specserve.speculation import Decision, EngineTraits, Policy, StepContext, make_policy, parse_spec
from specserve.speculation.policy import build_params, largest_k

if TYPE_CHECKING:
    from specserve.sim.replica import Replica


@dataclass(slots=True)
class Truth:
    """What only the simulator knows, for the policies that may read it. ``replica`` is filled in once the replica
    that runs the policy exists (it is built with the policy); the policy reads its batch, queue and free KV."""

    table: RequestTable
    acceptance: TrueAcceptance
    timer: StepTimer
    replica: Replica | None = field(default=None)


@dataclass(frozen=True, slots=True)
class Prices:
    """The coming step at every k = 0..max_k (index k)."""

    decode_tokens: np.ndarray  # expected tokens the decoding requests emit
    step_s: np.ndarray  # the step's true time
    decode_s: np.ndarray  # step_s less the prefill chunk's marginal cost
    fits: np.ndarray  # bool: its new KV blocks fit the free ones (no preemption)


@dataclass(frozen=True, slots=True)
class OracleParams:
    # Largest k searched, capped by the engine's max_k; unset: the engine's.
    max_k: int | None = None
    # Charge the decodes the step minus the prefill chunk's marginal cost (module docstring); false charges them
    # the whole step.
    prefill_at_margin: bool = True

    def __post_init__(self) -> None:
        if self.max_k is not None and self.max_k < 0:
            raise ValueError(f"max_k={self.max_k} must be non-negative")


class OraclePolicy(Policy):
    """Per step, the batch k with the most expected decode tokens per decode second, from the simulator's truth."""

    name = "oracle"
    Params = OracleParams

    def __init__(self, params: OracleParams, traits: EngineTraits, truth: Truth) -> None:
        super().__init__(params, traits)
        self.max_k = largest_k(params.max_k, traits)
        self.truth = truth
        self._k = 0

    def choose(self, ctx: StepContext) -> Decision:
        if not ctx.draft_resident:
            return Decision(k=0)
        goodputs = self.goodputs()
        if goodputs is None:
            # Nothing decodes: k changes no token, so keeping it spares a switch.
            return Decision(k=self._k)
        self._k = int(np.argmax(goodputs))
        return Decision(k=self._k)

    def goodputs(self) -> np.ndarray | None:
        """Expected decode tokens per decode second for k = 0..max_k (0 where k would preempt and k = 0 would not);
        None when no running request decodes this step."""
        prices = self.price()
        if prices is None:
            return None
        decode_s = prices.decode_s if self.params.prefill_at_margin else prices.step_s
        goodputs = prices.decode_tokens / np.maximum(decode_s, 1e-9)
        return np.where(prices.fits, goodputs, 0.0) if prices.fits.any() else goodputs

    def price(self) -> Prices | None:
        """The coming step priced at every k = 0..max_k from the replica's state; None when nothing decodes."""
        replica = self.truth.replica
        if replica is None:
            raise RuntimeError("oracle asked before the simulator bound its replica")
        cfg, b = replica.cfg, replica.batch
        remaining = b.prompt + b.num_output - b.num_computed
        decoding = (remaining == 1) & (b.num_output > 0)
        if not decoding.any():
            return None
        ks = np.arange(self.max_k + 1)[:, None]
        # The replica's grant (replica._grant) at every k at once: one row per k, one column per running request.
        need = np.where(decoding, 1 + ks, remaining)
        before = np.cumsum(need, axis=1) - need
        tokens = np.minimum(np.maximum(cfg.max_num_batched_tokens - before, 0), need)
        if not cfg.enable_chunked_prefill:
            tokens = np.where(decoding | (tokens == need), tokens, 0)
        drafts = np.where(decoding, np.maximum(tokens - 1, 0), 0)
        new_blocks = np.maximum((b.num_computed + tokens + cfg.block_size - 1) // cfg.block_size - b.num_blocks, 0)
        free_blocks = replica.num_kv_blocks_free - new_blocks.sum(axis=1)
        admitted, num_admitted = self._admitted(cfg.max_num_batched_tokens - tokens.sum(axis=1), free_blocks, len(b))
        scheduled = tokens > 0
        new_tokens = tokens - drafts
        read = tokens if cfg.draft_first_pass == "scheduled" else new_tokens  # the draft's first pass (replica.py)
        expected = self._expected_tokens(b.alpha, drafts)
        step_s, decode_s = np.empty(len(ks)), np.empty(len(ks))
        for k in range(len(ks)):
            step_s[k], decode_s[k] = self._seconds(
                k,
                drafts[k],
                int((b.num_computed * scheduled[k]).sum()),
                int(tokens[k].sum() + admitted[k]),
                int(new_tokens[k][~decoding].sum() + admitted[k]),
                int(read[k].sum() + admitted[k] + b.draft_lag[scheduled[k]].sum()),
                b.num_computed,
                int(scheduled[k].sum() + num_admitted[k]),
            )
        return Prices(
            decode_tokens=(expected * (decoding & scheduled)).sum(axis=1),
            step_s=step_s,
            decode_s=decode_s,
            fits=free_blocks >= 0,
        )

    def _admitted(
        self, budgets: np.ndarray, free_blocks: np.ndarray, num_running: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Prompt tokens the replica's FCFS admission (replica._admit) schedules into each k's leftover budget and
        free KV blocks, and the requests they belong to: requests in queue order while seats, budget and blocks
        last, the first misfit ends it."""
        replica = self.truth.replica
        assert replica is not None
        cfg, table = replica.cfg, self.truth.table
        seats = cfg.max_num_seqs - num_running
        if seats <= 0 or not replica.waiting:
            none = np.zeros(len(budgets), dtype=np.int64)
            return none, none
        asks = np.fromiter(
            (int(table.prompt_tokens[r] + table.num_output[r]) for r in islice(replica.waiting, seats)), dtype=np.int64
        )
        starts = (np.cumsum(asks) - asks)[None, :]
        room = budgets[:, None] - starts
        tokens = np.clip(room, 0, asks)
        ok = room > 0
        if not cfg.enable_chunked_prefill:
            ok &= tokens == asks
        ok &= np.cumsum(-(-tokens // cfg.block_size), axis=1) <= free_blocks[:, None]
        kept = np.cumprod(ok, axis=1)
        return (tokens * kept).sum(axis=1), kept.sum(axis=1)

    def _expected_tokens(self, alphas: np.ndarray, drafts: np.ndarray) -> np.ndarray:
        """Per k and request, 1 + the expected accepted prefix of ``drafts`` drafts (true_acceptance's chain)."""
        depth = max(int(drafts.max()), 1)
        prefix = np.cumprod(self.truth.acceptance.position_probs(alphas, depth), axis=1)
        cumulative = np.concatenate((np.zeros((len(alphas), 1)), np.cumsum(prefix, axis=1)), axis=1)
        return 1.0 + np.take_along_axis(cumulative.T, drafts, axis=0)

    def _seconds(
        self,
        k: int,
        drafts: np.ndarray,
        num_context: int,
        num_batched: int,
        prefill_tokens: int,
        first_pass_tokens: int,
        num_computed: np.ndarray,
        num_scheduled: int,
    ) -> tuple[float, float]:
        """The step's true time at this k (replica._price, without drawing verdicts), and that time less the
        prefill chunk's marginal cost. The proposer's passes are the replica's: its proposer's k = 0 rule (the
        method's where it has one, not the engine setting's), and a lookup's one search a step for every scheduled
        request, none at k = 0."""
        timer = self.truth.timer
        replica = self.truth.replica
        assert replica is not None
        cfg, proposer = replica.cfg, replica.proposer
        passes: list[int] = []
        if proposer.one_pass:
            passes = proposer.lookup_passes(k, num_scheduled)
        else:
            num_passes = int(drafts.max()) if drafts.any() else int(k > 0 or proposer.k0_runs_pass)
            if num_passes:
                further = (drafts[:, None] >= np.arange(2, num_passes + 1)).sum(axis=0).tolist()
                passes = [first_pass_tokens, *further]
        target_context = None
        if cfg.scorer == "batch_expansion" and drafts.any():
            target_context = num_context + int((drafts * num_computed + drafts * (drafts + 1) // 2).sum())
        step_s = timer.step_s(num_context, num_batched, passes, target_context, verifies=bool(drafts.any()))
        if not prefill_tokens:
            return step_s, step_s
        margin_s = timer.target.forward_s(num_context, prefill_tokens) - timer.target.forward_s(num_context, 0)
        if passes:
            margin_s += timer.draft.forward_s(num_context, prefill_tokens) - timer.draft.forward_s(num_context, 0)
        return step_s, step_s - margin_s


# Simulator-only policies by name: each is built with the run's Truth.
SIM_POLICIES: dict[str, type[OraclePolicy]] = {OraclePolicy.name: OraclePolicy}


def build_policy(spec: str, traits: EngineTraits, truth: Truth) -> Policy:
    """A simulator-only policy (``SIM_POLICIES``) with the run's truth, or any registered policy by its spec."""
    name, raw = parse_spec(spec)
    cls = SIM_POLICIES.get(name)
    if cls is None:
        return make_policy(spec, traits)
    return cls(build_params(cls, raw), traits, truth)


def check_policy(spec: str, traits: EngineTraits) -> None:
    """Raise ValueError naming what is wrong with ``spec`` for a simulator run, before any run starts."""
    name, raw = parse_spec(spec)
    cls = SIM_POLICIES.get(name)
    if cls is None:
        make_policy(spec, traits)
    else:
        build_params(cls, raw)

"""Start-up checks of an engine's speculation, from its own counters: the plan of probe runs and the verdicts.

Before a replica serves (and in `specserve doctor`), a short calibration runs dummy requests at each k from 0 to
the engine's max_k over a few batch sizes, reading the scheduler's and the worker's counters around each run. The
checks say whether specserve's control holds on this engine, rather than assume that what the CPU tests showed
carries over to another platform or vLLM build:

- ``k_honoured``: every draft proposal the worker made was as wide as the k its step asked (a proposer that drafts
  max_k whatever is asked, as vLLM's Model Runner V2 draft-model speculator does, fails it);
- ``k0_no_draft_pass``: the worker skipped the draft's pass on exactly the steps the scheduler counted as skipped
  k = 0 decode steps, and there were some (a worker that drafts anyway fails it);
- ``draft_signals``: where the policies may read the draft's confidences, every draft list the scheduler received
  at k > 0 carried them (an engine path that hands the scheduler no drafts, such as async scheduling, fails it).

The same runs time steps at each (k, batch): the cost table `doctor` prints and the step records the configured
policy's cost model is warm-started from. Pure Python over plain numbers: no vllm, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import median

from specserve.speculation.estimators.acceptance import expected_tokens_upto

#: Batch sizes every calibration runs at (capped by the engine's max_num_seqs): a latency-bound step, a small batch,
#: and a larger one, enough for a step-cost fit to see the batch's slope.
SMALL_BATCH_SIZES = (1, 4, 8)
#: Past the small ones, each batch size this many times the one before, up to the engine's max_num_seqs.
BATCH_GROWTH = 4
#: Output tokens per dummy request: a prefill step and enough decode steps at every k to time a few.
CALIBRATION_MAX_TOKENS = 16
#: Prompt tokens per dummy request: short, so the runs time decode steps, not prefills.
CALIBRATION_PROMPT_TOKENS = 12


def batch_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """The batch sizes a calibration runs at on an engine of ``max_num_seqs`` seats: ``SMALL_BATCH_SIZES``, then
    every ``BATCH_GROWTH``-fold batch past them and ``max_num_seqs`` itself (1, 4, 8, 32, 128, 256 at vLLM's
    GPU default of 256). A step-cost fit that has timed small batches only prices a draft pass at a large one from
    its prior: in the simulator (Llama-3.1-8B + 1B draft, H100), a policy calibrated at batch 8 at most ran k = 0
    under 256 clients, where k = 1 serves 16 % more, and one calibrated up to 256 ran k = 1."""
    sizes = {min(b, max_num_seqs) for b in SMALL_BATCH_SIZES}
    size = max(SMALL_BATCH_SIZES)
    while size * BATCH_GROWTH < max_num_seqs:
        size *= BATCH_GROWTH
        sizes.add(size)
    sizes.add(max(max_num_seqs, 1))
    return tuple(sorted(sizes))


@dataclass(frozen=True, slots=True)
class Probe:
    """One calibration run: ``batch`` dummy requests decoded together under ``fixed:k=K``."""

    k: int
    batch: int


def plan(max_k: int, max_num_seqs: int, sizes: Sequence[int] | None = None) -> list[Probe]:
    """Every k from 0 to ``max_k`` at every batch size (``batch_sizes`` unless given) the engine holds, smallest
    first."""
    chosen = batch_sizes(max_num_seqs) if sizes is None else sizes
    return [
        Probe(k, batch) for batch in sorted({min(b, max_num_seqs) for b in chosen if b >= 1}) for k in range(max_k + 1)
    ]


@dataclass(frozen=True, slots=True)
class CheckCounts:
    """Cumulative counters read before and after a probe (``scheduler.check_counts`` and the worker's)."""

    # Scheduler: steps, steps at k = 0 whose draft pass it counted as skipped, draft lists received (one per
    # request per drafting step), and those that carried the draft's confidences.
    num_steps: int
    num_steps_draft_skipped: int
    num_draft_lists: int
    num_draft_lists_with_signals: int
    # Worker: draft passes run and skipped, proposals made and those whose width was not the step's k.
    num_passes_ran: int
    num_passes_skipped: int
    num_proposals: int
    num_proposals_not_k: int

    def __sub__(self, before: CheckCounts) -> CheckCounts:
        return CheckCounts(*(a - b for a, b in zip(_values(self), _values(before), strict=True)))


def _values(counts: CheckCounts) -> tuple[int, ...]:
    return tuple(getattr(counts, name) for name in CheckCounts.__slots__)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    probe: Probe
    counts: CheckCounts  # what the probe's run added
    # Durations of the probe's decode-only steps at its full batch, seconds.
    step_s: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    expected: str
    seen: str
    ok: bool


def evaluate(results: Sequence[ProbeResult], *, skips_k0_draft_pass: bool, signals: bool) -> list[CheckResult]:
    """The checks over every probe's counts. A check with nothing to judge (no k > 0 probe, skipping off) passes
    and says so."""
    at_k = [r.counts for r in results if r.probe.k > 0]
    proposals = sum(c.num_proposals for c in at_k)
    wrong = sum(c.num_proposals_not_k for c in _all(results))
    checks = [
        CheckResult(
            "k_honoured",
            "every draft proposal as wide as its step's k",
            f"{wrong} of {sum(c.num_proposals for c in _all(results))} proposals another width",
            wrong == 0 and proposals > 0,
        )
    ]
    at_zero = [r.counts for r in results if r.probe.k == 0]
    ran = sum(c.num_passes_ran for c in at_zero)
    worker_skipped = sum(c.num_passes_skipped for c in at_zero)
    scheduler_skipped = sum(c.num_steps_draft_skipped for c in at_zero)
    if skips_k0_draft_pass:
        checks.append(
            CheckResult(
                "k0_no_draft_pass",
                f"draft pass skipped on the {scheduler_skipped} k = 0 decode steps the scheduler counted",
                f"worker skipped {worker_skipped}, ran {ran} (prefills run it)",
                scheduler_skipped > 0 and worker_skipped == scheduler_skipped,
            )
        )
    else:
        checks.append(CheckResult("k0_no_draft_pass", "skip_k0_draft_pass off: not checked", "-", True))
    if signals:
        lists = sum(c.num_draft_lists for c in at_k)
        with_signals = sum(c.num_draft_lists_with_signals for c in at_k)
        checks.append(
            CheckResult(
                "draft_signals",
                "every draft list at k > 0 reaches the scheduler with its confidences",
                f"{with_signals} of {lists} draft lists",
                lists > 0 and with_signals == lists,
            )
        )
    else:
        checks.append(CheckResult("draft_signals", "draft_signals off: not checked", "-", True))
    return checks


def _all(results: Iterable[ProbeResult]) -> list[CheckCounts]:
    return [r.counts for r in results]


def cost_table(results: Sequence[ProbeResult]) -> list[tuple[int, int, float | None]]:
    """(k, batch, median decode step seconds) per probe; None where a probe ran no full decode step."""
    return [(r.probe.k, r.probe.batch, median(r.step_s) if r.step_s else None) for r in results]


def payoff_table(
    costs: Sequence[tuple[int, int, float | None]], alphas: Sequence[float]
) -> list[tuple[int, int, float, float | None]]:
    """Per (k, batch) of ``costs``: the tokens a request emits a step at k with per-position acceptance ``alphas``
    (conditional, as TurboSpec's Eq. 4 takes them) and the speed-up over k = 0 at that batch, tokens(k) x
    step(0) / step(k); None where either step was not timed."""
    max_k = max((k for k, _, _ in costs), default=0)
    tokens = expected_tokens_upto(alphas, max_k)
    at_zero = {batch: step_s for k, batch, step_s in costs if k == 0}
    rows: list[tuple[int, int, float, float | None]] = []
    for k, batch, step_s in costs:
        base = at_zero.get(batch)
        speedup = None if step_s is None or base is None or step_s <= 0.0 else tokens[k] * base / step_s
        rows.append((k, batch, tokens[k], speedup))
    return rows


def failed(checks: Iterable[CheckResult]) -> tuple[str, ...]:
    return tuple(c.name for c in checks if not c.ok)

"""What each k cost an engine, read from its step log (``specserve.speculation.step_log``).

Two questions a policy's own counters cannot answer. *What does a decode step at batch B and k cost here, and
what does it yield?* Pure decode steps (every scheduled token a decode row: B x (k + 1)) are grouped by batch
size and k, across every policy that ran, and their median seconds and tokens per second reported. *What does
changing k cost?* A step is steady when it and the two before it ran the same k at the same batch size; the
first and second steps after a change of k are compared with the steady median of their own (batch, k), so the
excess is not the shape's. So is the last step before the change, at the old k: where it ran slow as well, the
change followed a slow phase of the machine rather than causing one (on a served 2-core engine it mostly did).
Switches are told apart by whether they stop speculating (to k = 0), resume it (from k = 0) or move between two
k > 0: a resume's first step also catches the draft up, so it is not a pure decode step and is not reported.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from lab.experiments.policy_replay import runs
from specserve.speculation.step_log import LoggedStep
from specserve.speculation.types import StepRecord

# Steady steps a (batch, k) cell needs before a switch's steps are measured against its median.
MIN_STEADY = 10


@dataclass(frozen=True, slots=True)
class Cell:
    """Pure decode steps at one batch size and k."""

    num_running: int
    k: int
    steps: int
    median_s: float
    median_tokens_per_s: float


@dataclass(frozen=True, slots=True)
class SwitchExcess:
    """Steps after a change of k against steady steps of the same (batch, k): relative excess of their seconds."""

    kind: str  # "stop" (to k = 0), "resume" (from k = 0) or "move" (between two k > 0)
    position: int  # -1: the last step at the old k, 1: the first step at the new k, 2: the second
    steps: int
    median: float
    mean: float


def _is_decode(record: StepRecord) -> bool:
    return record.num_running > 0 and record.num_batched_tokens == record.num_running * (record.k + 1)


def decode_cells(steps: Sequence[LoggedStep], policy: str = "", min_steps: int = 1) -> list[Cell]:
    """Every (batch, k) with at least ``min_steps`` pure decode steps, among runs whose spec starts with
    ``policy``; sorted by batch size, then k."""
    seconds: dict[tuple[int, int], list[float]] = defaultdict(list)
    rates: dict[tuple[int, int], list[float]] = defaultdict(list)
    for start, stop in runs(steps):
        if not steps[start].policy.startswith(policy):
            continue
        for logged in steps[start:stop]:
            record = logged.record
            if _is_decode(record) and record.duration_s > 0:
                key = (record.num_running, record.k)
                seconds[key].append(record.duration_s)
                rates[key].append(record.num_emitted_tokens / record.duration_s)
    return [
        Cell(b, k, len(seconds[(b, k)]), statistics.median(seconds[(b, k)]), statistics.median(rates[(b, k)]))
        for b, k in sorted(seconds)
        if len(seconds[(b, k)]) >= min_steps
    ]


def switch_excess(steps: Sequence[LoggedStep], policy: str = "") -> list[SwitchExcess]:
    """The last step before each change of k and the first two after it, against their (batch, k)'s steady
    median."""
    steady: dict[tuple[int, int], list[float]] = defaultdict(list)
    chosen = [[s.record for s in steps[a:b]] for a, b in runs(steps, policy)]
    for records in chosen:
        for i in range(2, len(records)):
            window = records[i - 2 : i + 1]
            if _is_decode(records[i]) and len({(r.k, r.num_running) for r in window}) == 1:
                steady[(records[i].num_running, records[i].k)].append(records[i].duration_s)
    medians = {key: statistics.median(v) for key, v in steady.items() if len(v) >= MIN_STEADY}
    excess: dict[tuple[str, int], list[float]] = defaultdict(list)
    for records in chosen:
        for i in range(1, len(records)):
            before, first = records[i - 1], records[i]
            if before.k == first.k or before.num_running != first.num_running:
                continue
            kind = "stop" if first.k == 0 else "resume" if before.k == 0 else "move"
            after = records[i + 1 : i + 2]
            for position, record in ((-1, before), (1, first), *((2, r) for r in after if r.k == first.k)):
                key = (record.num_running, record.k)
                if _is_decode(record) and record.num_running == first.num_running and key in medians:
                    excess[(kind, position)].append(record.duration_s / medians[key] - 1.0)
    return [
        SwitchExcess(kind, position, len(v), statistics.median(v), statistics.fmean(v))
        for (kind, position), v in sorted(excess.items())
    ]


def format_report(cells: Sequence[Cell], switches: Sequence[SwitchExcess]) -> str:
    lines = ["| batch | k | steps | median step ms | median output tok/s |", "|---|---|---|---|---|"]
    lines += [
        f"| {c.num_running} | {c.k} | {c.steps} | {1e3 * c.median_s:.1f} | {c.median_tokens_per_s:.1f} |" for c in cells
    ]
    lines += [
        "",
        "| switch | step (-1: last before it) | steps | median excess | mean excess |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {s.kind} | {s.position} | {s.steps} | {100 * s.median:+.1f} % | {100 * s.mean:+.1f} % |" for s in switches
    ]
    return "\n".join(lines)

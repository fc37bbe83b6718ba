"""A `--clients` schedule's phases in a policy comparison: each policy's rate in each phase against the best
fixed policy of that phase, and what a policy could gain at most by switching k between phases.

The most is the schedule served by the best fixed policy of each phase, each phase's tokens as that policy
served them in the same round, over the best single fixed policy's tokens in that round: a policy that
changes k with the load can beat the best single k by no more than that, save by choosing better than any
fixed k within a phase. Phase tokens are counted as the window counts them (``report.window``), so the
requests of one phase still streaming in the next count where their tokens arrived.

A phase can be too short to compare anything: where its clients finish less than one request each within it
(its tokens over its clients times the mean output length), it only admits one request a client, whose tokens
stream into the phases after it whatever k serves them, and the schedule's tokens are set by the requests sent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from specserve.bench.stats import METRICS, by_round, median_interval, metric_value, ratios_to_best


def phase_rate(index: int) -> Callable[[dict[str, Any]], float]:
    def value(report: dict[str, Any]) -> float:
        phases = (report.get("window") or {}).get("phases") or ()
        return float(phases[index]["output_tokens_per_s"]) if index < len(phases) else float("nan")

    return value


#: Below this many requests finished per client within a phase of several clients, the page says the phase only
#: admitted its requests (see the module's docstring).
MIN_REQUESTS_PER_CLIENT = 1.0


def requests_per_client(report: dict[str, Any], index: int) -> float:
    """Requests a client of phase ``index`` finished within it: the phase's tokens over its clients times the
    run's mean output length (NaN where the run has no such phase or no completed request)."""
    phases = (report.get("window") or {}).get("phases") or ()
    completed = report["requests"]["completed"]
    output = (report.get("tokens") or {}).get("output")
    if index >= len(phases) or not completed or not output:
        return float("nan")
    return float(phases[index]["output_tokens"]) / (phases[index]["clients"] * output / completed)


def whole_rate(report: dict[str, Any]) -> float:
    return metric_value(report, METRICS["tok_s"])


def summarize(
    runs: list[dict[str, Any]],
    policies: Sequence[str],
    fixed: Sequence[int],
    best_single: str | None,
    resamples: int,
    seed: int,
) -> dict[str, Any] | None:
    """Per phase: the best fixed policy and every policy's ratio to it; and the switching headroom over
    ``best_single``, the best fixed policy over the whole schedule (as the point's own table ranks it). None for a
    point whose runs have no phases (not a schedule)."""
    first = next((r for r in runs if (r["report"].get("window") or {}).get("phases")), None)
    if first is None or not fixed or best_single is None:
        return None
    shape = [{k: p[k] for k in ("clients", "start_s", "s")} for p in first["report"]["window"]["phases"]]
    whole = by_round(runs, policies, whole_rate)
    if whole.shape[1] == 0:
        return None
    out: dict[str, Any] = {"phases": shape, "best_fixed": [], "ratios": {p: [] for p in policies}, "per_client": []}
    best_tokens = np.zeros(whole.shape[1])
    for i, phase in enumerate(shape):
        rates = by_round(runs, policies, phase_rate(i))
        best, intervals = ratios_to_best(rates, fixed, True, resamples, seed)
        out["best_fixed"].append(policies[best])
        for policy, interval in zip(policies, intervals, strict=True):
            out["ratios"][policy].append(interval)
        best_tokens += rates[best] * phase["s"]
        per_client = [requests_per_client(r["report"], i) for r in runs]
        known = [x for x in per_client if not np.isnan(x)]
        out["per_client"].append(float(np.median(known)) if known else None)
    window_s = sum(p["s"] for p in shape)
    out["best_single"] = best_single
    single_tokens = whole[list(policies).index(best_single)] * window_s
    out["headroom"] = median_interval(best_tokens / single_tokens, resamples, seed)
    return out


def clients(n: int) -> str:
    return f"{n} client" if n == 1 else f"{n} clients"


def markdown(entry: dict[str, Any], policies: Sequence[str]) -> list[str]:
    """The phase table of one point (``summarize``'s output)."""
    columns = [f"{clients(p['clients'])}, {p['start_s']:g}-{p['start_s'] + p['s']:g} s" for p in entry["phases"]]
    lines = [
        "",
        "Output tok/s in each phase ÷ the best fixed policy of that phase (tokens counted where they streamed):",
        "",
        "| policy | " + " | ".join(columns) + " |",
        "|---" * (len(columns) + 1) + "|",
    ]
    for policy in policies:
        cells = [f"{i.value:.3f} [{i.low:.3f}, {i.high:.3f}]" for i in entry["ratios"][policy]]
        lines.append(f"| `{policy}` | " + " | ".join(cells) + " |")
    lines.append("| best fixed | " + " | ".join(f"`{p}`" for p in entry["best_fixed"]) + " |")
    h = entry["headroom"]
    lines += [
        "",
        f"The best fixed policy of each phase, phase by phase, would have served {h.value:.3f} "
        f"[{h.low:.3f}, {h.high:.3f}] × `{entry['best_single']}`, the best single fixed policy, over the whole "
        "schedule: the most that switching k between phases can gain here.",
    ]
    short = [
        (p, n)
        for p, n in zip(entry["phases"], entry["per_client"], strict=True)
        if p["clients"] > 1 and n is not None and n < MIN_REQUESTS_PER_CLIENT
    ]
    for p, n in short:
        lines += [
            "",
            f"The {p['clients']}-client phase ({p['s']:g} s) is shorter than its requests: a client finished "
            f"{n:.2f} requests within it (median over runs), so it only admitted about one request a client, whose "
            "tokens streamed into the phases after it whatever k served them. The schedule's tokens are then set "
            "by the requests sent, not by how fast a policy served them, and neither the ratios above nor the most "
            "switching could gain measure the policies. Lengthen the phase or shorten the outputs.",
        ]
    return lines

"""Run summaries: one dict of base-unit numbers per (scenario, policy, seed), and the k series.

Definitions (all over the whole run; time starts at 0, the first possible arrival, and ends at the last
step's end, so an overloaded policy that drains slowly pays for it in throughput):
- throughput_tok_s: output tokens / run seconds (generation throughput; Nightjar's "total token
  throughput" adds prompt tokens, Nightjar §7.1). A closed loop (arrivals kind ``clients``) is rated as
  ``specserve bench`` rates one: the output tokens emitted within its phases over their length, the drain after
  the last phase left out; ``phases`` then holds each phase's clients, start, length, tokens and rate.
- goodput_tok_s: output tokens of requests meeting the scenario SLO (TTFT and TPOT caps) / run seconds;
  equal to throughput when the scenario has no SLO.
- slo_attainment: share of requests with a TPOT (2+ output tokens) whose TPOT is at most the scenario's
  TPOT SLO (AdaSpec §7.1: its "SLO attainment"; TTFT plays no part), in 0-1; None when
  the scenario sets no TPOT SLO.
- acceptance: accepted / drafted tokens over all verified drafts (vLLM's draft acceptance rate; a prefix
  count, so below the per-position alpha of TurboSpec §4.1.3, Eq. 4).
- mean_k: mean of the k chosen per step; k_switches: steps whose k differs from the previous step's.
- mean_tpot_s: per request, (finish - first token) / (output tokens - 1), averaged over requests with 2+;
  p99_tpot_s: the 99th percentile of the same per-request values.
"""

from __future__ import annotations

import numpy as np

from specserve.sim.config import ClientPhase, ClientsArrivals, SloConfig
from specserve.sim.kernel import SimResult

Summary = dict[str, float | int | str | None | list[dict[str, float | int]]]


def summarize(result: SimResult) -> Summary:
    table = result.table
    e2e = table.finish_s - table.arrival_s
    ttft = table.first_token_s - table.arrival_s
    multi = table.output_tokens > 1
    tpot = (table.finish_s[multi] - table.first_token_s[multi]) / (table.output_tokens[multi] - 1)
    run_s = max(result.end_s, 1e-12)
    num_tokens = int(table.num_output.sum())
    arrivals = result.resolved.scenario.workload.arrivals
    phases = _phases(result, arrivals.phases) if isinstance(arrivals, ClientsArrivals) else None
    good = _meets_slo(result.resolved.scenario.slo, ttft, table)
    ks = np.concatenate([np.asarray(r.series_k) for r in result.replicas]) if result.replicas else np.zeros(0)
    drafted = sum(r.num_drafted for r in result.replicas)
    accepted = sum(r.num_accepted for r in result.replicas)
    return {
        "policy": result.policy_spec,
        "throughput_tok_s": _window_rate(phases) if phases else num_tokens / run_s,
        "goodput_tok_s": float(table.num_output[good].sum()) / run_s,
        "slo_attainment": _tpot_attainment(result.resolved.scenario.slo, tpot),
        "mean_e2e_s": _mean(e2e),
        "p99_e2e_s": float(np.percentile(e2e, 99)) if len(e2e) else 0.0,
        "mean_ttft_s": _mean(ttft),
        "mean_tpot_s": _mean(tpot),
        "p99_tpot_s": float(np.percentile(tpot, 99)) if len(tpot) else 0.0,
        "acceptance": accepted / drafted if drafted else 0.0,
        "mean_k": _mean(ks),
        "k_switches": sum(int(np.count_nonzero(np.diff(r.series_k))) for r in result.replicas),
        "wall_s": result.wall_s,
        "num_requests": len(table.arrival_s),
        "num_steps": int(len(ks)),
        "num_preemptions": int(table.num_preemptions.sum()),
        "run_s": result.end_s,
        **({"phases": phases} if phases else {}),
    }


def _phases(result: SimResult, phases: list[ClientPhase]) -> list[dict[str, float | int]]:
    """Per phase of a closed loop: the output tokens of the steps that ended within it, and their rate."""
    end_s = np.concatenate([np.asarray(r.series_end_s, dtype=np.float64) for r in result.replicas])
    tokens = np.concatenate([np.asarray(r.series_tokens, dtype=np.int64) for r in result.replicas])
    rows, start_s = [], 0.0
    for phase in phases:
        within = (end_s > start_s) & (end_s <= start_s + phase.duration_s)
        count = int(tokens[within].sum())
        rows.append(
            {
                "clients": phase.clients,
                "start_s": start_s,
                "s": phase.duration_s,
                "output_tokens": count,
                "output_tokens_per_s": count / phase.duration_s,
            }
        )
        start_s += phase.duration_s
    return rows


def _window_rate(phases: list[dict[str, float | int]]) -> float:
    return sum(p["output_tokens"] for p in phases) / sum(p["s"] for p in phases)


def k_series(result: SimResult) -> list[dict[str, list]]:
    """Per replica: step start times, the k of each step and its scheduled requests (for plots)."""
    return [
        {"time_s": list(r.series_time_s), "k": list(r.series_k), "num_running": list(r.series_running)}
        for r in result.replicas
    ]


def _meets_slo(slo: SloConfig | None, ttft: np.ndarray, table) -> np.ndarray:
    ok = np.ones(len(ttft), dtype=bool)
    if slo is None:
        return ok
    if slo.max_ttft_s is not None:
        ok &= ttft <= slo.max_ttft_s
    if slo.max_tpot_s is not None:
        decode_s = table.finish_s - table.first_token_s
        ok &= decode_s <= slo.max_tpot_s * np.maximum(table.output_tokens - 1, 0)
    return ok


def _tpot_attainment(slo: SloConfig | None, tpot: np.ndarray) -> float | None:
    if slo is None or slo.max_tpot_s is None:
        return None
    return _mean(tpot <= slo.max_tpot_s)


def _mean(values: np.ndarray) -> float:
    return float(np.mean(values)) if len(values) else 0.0

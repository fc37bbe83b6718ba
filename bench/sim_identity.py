"""Byte-identity of simulator runs: one hash per run over everything a run leaves, to check that a change meant to
make the simulator faster changes none of its results.

    .venv/bin/python bench/sim_identity.py [--only NAME,...] [--write FILE] [--check FILE]

Runs a fixed set of short, varied runs (several policies, per-request caps, draft signals and early stops, drafts
made a step ahead, batch expansion, a lookup proposer, a closed loop, draft offload with the cluster planner and
locally, a scale-out) and hashes, per run: every step's StepRecord and StepStats in order (``repr``: floats exactly),
the summary (wall time left out), each replica's series, counters, guard errors and policy ``describe()``, the
request table's columns, the processed events, the draft memory's state changes and reloads, and the router's
counts. Prints ``name hash`` lines; ``--write`` saves them, ``--check`` compares against a saved file and exits 1 on
any difference.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from specserve.sim import Scenario, StepStats, load_scenario, parse_scenario, simulate, summarize
from specserve.sim.cluster_slice import cluster_slice
from specserve.speculation import StepRecord

SCENARIOS = Path(__file__).resolve().parents[1] / "specserve/sim/scenarios"


def small(**overrides: Any) -> Scenario:
    """Llama-2-7B + 160m on an H100, linear step times, Poisson 8 QPS for 8 s over two replicas."""
    raw: dict[str, Any] = {
        "name": "identity-small",
        "hardware": "h100",
        "pair": "llama2-7b+160m",
        "latency": {"kind": "linear"},
        "num_replicas": 2,
        "engine": {"max_k": 4},
        "workload": {
            "lengths": {
                "prompt_tokens": {"mean": 96, "std": 48, "max_tokens": 512},
                "output_tokens": {"mean": 64, "std": 32, "max_tokens": 256},
            },
            "arrivals": {"kind": "poisson", "rate_qps": 8, "duration_s": 8},
        },
        "acceptance": {"mean": 0.7},
    }
    for key, value in overrides.items():
        raw[key] = {**raw[key], **value} if isinstance(value, dict) and isinstance(raw.get(key), dict) else value
    return parse_scenario(raw)


def builtin(name: str, duration_s: float, num_replicas: int | None = None) -> Scenario:
    scenario = load_scenario(SCENARIOS / f"{name}.yaml")
    return cluster_slice(scenario, num_replicas or scenario.num_replicas, duration_s)


def closed_loop() -> Scenario:
    scenario = load_scenario(SCENARIOS / "method-draft-h100-8b-batch.yaml")
    arrivals = scenario.workload.arrivals
    phases = [p.model_copy(update={"duration_s": 2.0}) for p in arrivals.phases[:4]]  # type: ignore[union-attr]
    workload = scenario.workload.model_copy(update={"arrivals": arrivals.model_copy(update={"phases": phases})})
    return scenario.model_copy(update={"workload": workload})


# name -> (scenario builder, policy spec, seed)
RUNS: dict[str, tuple[Callable[[], Scenario], str, int]] = {
    "small-fixed": (lambda: small(), "fixed:k=2", 1),
    "small-cycle": (lambda: small(), "cycle:ks=0-3-1", 2),
    "small-adaptive": (lambda: small(), "adaptive", 3),
    "small-adaptive-per-request": (lambda: small(), "adaptive:per_request=true", 4),
    "small-goodput": (lambda: small(), "goodput", 5),
    "small-adaptive-signals": (lambda: small(acceptance={"mean": 0.7, "signals": {"enabled": True}}), "adaptive", 6),
    "small-adaptive-ahead": (lambda: small(engine={"max_k": 4, "drafts_ahead": True}), "adaptive", 7),
    "small-adaptive-expansion": (lambda: small(engine={"max_k": 4, "scorer": "batch_expansion"}), "adaptive", 8),
    "small-kld-signals": (lambda: small(acceptance={"mean": 0.6, "signals": {"enabled": True}}), "kld", 9),
    "ngram-adaptive": (lambda: builtin("mixed-ngram-h100-8b", 20), "adaptive", 10),
    "closed-loop-adaptive": (closed_loop, "adaptive", 11),
    "nightjar-adaptive": (lambda: builtin("nightjar-4090-7b-dynamic", 100), "adaptive", 12),
    "cluster-adaptive": (lambda: builtin("cluster-4090-7b-64x-hour", 40, 8), "adaptive", 0),
    "cluster-offload-adaptive": (lambda: _pressed(builtin("cluster-4090-7b-64x-hour", 160, 8)), "adaptive", 3),
    "cluster-offload-per-request": (
        lambda: _pressed(builtin("cluster-4090-7b-64x-hour", 160, 4)),
        "adaptive:per_request=true",
        1,
    ),
    "cluster-local-adaptive": (lambda: _local(_pressed(builtin("cluster-4090-7b-64x-hour", 160, 4))), "adaptive", 2),
    "cluster-fixed": (lambda: builtin("cluster-4090-7b-64x-hour", 30, 4), "fixed:k=3", 2),
    "scale-out-adaptive": (lambda: _pressed(builtin("cluster-4090-7b-scale-out", 150, 4)), "adaptive", 0),
}


def _local(scenario: Scenario) -> Scenario:
    return scenario.model_copy(update={"memory": scenario.memory.model_copy(update={"coordination": "local"})})


def _pressed(scenario: Scenario, num_kv_blocks: int = 1200) -> Scenario:
    """A smaller KV pool, so that a short slice fills it and drafts are offloaded and reloaded."""
    engine = scenario.engine.model_copy(update={"num_kv_blocks": num_kv_blocks})
    return scenario.model_copy(update={"engine": engine})


def _array(h: Any, value: np.ndarray) -> None:
    h.update(str(value.dtype).encode())
    h.update(repr(value.tolist()).encode() if value.dtype == object else np.ascontiguousarray(value).tobytes())


def run_hash(name: str) -> tuple[str, int, float]:
    """The run's hash, its step count and its wall seconds."""
    build, policy, seed = RUNS[name]
    h = hashlib.sha256()
    steps = 0

    def on_step(record: StepRecord, stats: StepStats) -> None:
        nonlocal steps
        steps += 1
        h.update(repr(record).encode())
        h.update(repr(stats).encode())

    wall = time.perf_counter()
    result = simulate(build(), policy, seed, on_step=on_step, max_trace_events=10**9)
    wall = time.perf_counter() - wall
    summary = summarize(result)
    summary.pop("wall_s")
    h.update(repr(sorted(summary.items())).encode())
    for replica in result.replicas:
        for series in ("series_time_s", "series_k", "series_running", "series_end_s", "series_tokens"):
            h.update(repr(getattr(replica, series)).encode())
        h.update(repr((replica.num_drafted, replica.num_accepted, replica.num_kv_blocks_free)).encode())
        h.update(repr((replica.num_kv_blocks_total, sorted(replica.guard.errors.items()))).encode())
        h.update(repr(sorted(replica.guard.describe().items())).encode())
        if replica.acceptance_evidence is not None:
            evidence = replica.acceptance_evidence
            h.update(repr((evidence.accepted_counts(), evidence.num_reached())).encode())
    for column, value in sorted(vars(result.table).items()):
        h.update(column.encode())
        _array(h, np.asarray(value))
    h.update(repr(result.trace).encode())
    h.update(repr(result.end_s).encode())
    if result.memory is not None:
        h.update(repr(result.memory.changes).encode())
        h.update(repr(result.memory.reloads).encode())
    if result.router is not None:
        h.update(repr((sorted(result.router.counts.items()), sorted(result.router.matched.items()))).encode())
    h.update(repr(result.scale_out_prior).encode())
    return h.hexdigest(), steps, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated run names (default: all)")
    parser.add_argument("--write", type=Path, help="save the hashes to this file")
    parser.add_argument("--check", type=Path, help="compare against hashes saved with --write")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(RUNS)
    lines = []
    for name in names:
        digest, steps, wall = run_hash(name)
        lines.append(f"{name} {digest}")
        print(f"{name:30s} {digest[:16]}  {steps:7d} steps  {wall:6.2f} s", file=sys.stderr, flush=True)
    if args.write:
        args.write.write_text("\n".join(lines) + "\n")
    if args.check:
        saved = dict(line.split() for line in args.check.read_text().splitlines() if line.strip())
        bad = [line.split()[0] for line in lines if saved.get(line.split()[0]) != line.split()[1]]
        print("identical" if not bad else f"DIFFERENT: {', '.join(bad)}", file=sys.stderr)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

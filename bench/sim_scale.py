"""The simulator at cluster scale (issue 62, parts 4-5): wall time per replica count on the 64-replica hour.

    .venv/bin/python bench/sim_scale.py [--runs 1:3600,8:600,64:240] [--full] [--seed 0] [--workers 1]
        [--policy adaptive] [--out bench/results/sim-scale]

Runs specserve/sim/scenarios/cluster-4090-7b-64x-hour.yaml under ``--policy`` (``adaptive``) on each
``replicas:seconds`` of ``--runs`` (``sim.cluster_slice``: the same load per replica, arrivals cut at that time; the
drain after it is simulated too), and with ``--full`` on all 64 replicas for the whole hour. Per run: wall and CPU
seconds, steps, microseconds per step, simulated replica-seconds per wall second, and what the draft memory did
(offloads, reloads, the most reloads at once on one node's link, the fewest drafts resident against the planner's
floor). Without a full run the hour's wall time is extrapolated: the steps per replica-second of the 1-replica hour,
times 64 x 3,600, times the 64-replica run's microseconds per step. ``--policy fixed:k=3`` prices the simulator's
own step: a policy with no work per step, drafting about as deep as ``adaptive`` does here (its mean k is 3.2-3.7).
``--workers N`` steps each run's replicas in up to N processes (whole nodes each, ``sim.parallel``; a run of fewer
nodes takes fewer); CPU seconds are then the calling process's only. Writes <out>.json, <out>.md and <out>.png.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only

import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend

from specserve.memory import DraftState  # noqa: E402
from specserve.sim import SimResult, load_scenario, simulate, summarize  # noqa: E402
from specserve.sim.cluster_slice import cluster_slice  # noqa: E402
from specserve.sim.parallel import num_nodes  # noqa: E402

SCENARIO = Path(__file__).resolve().parents[1] / "specserve/sim/scenarios/cluster-4090-7b-64x-hour.yaml"
HOUR_S = 3600.0


def memory_stats(result: SimResult) -> dict[str, Any]:
    """Offloads, reloads, reload concurrency per node link and the fewest drafts resident at once."""
    memory, n = result.memory, len(result.replicas)
    if memory is None:
        return {}
    per_node = result.resolved.scenario.memory.replicas_per_node
    # Each reload's copy on its node's link: from RELOADING to RESIDENT.
    started: dict[int, float] = {}
    copies: dict[int, list[tuple[float, int]]] = defaultdict(list)
    resident, fewest, fewest_s = n, n, 0.0
    for change in memory.changes:
        if change.state is DraftState.RELOADING:
            started[change.replica] = change.time_s
        elif change.state is DraftState.RESIDENT and change.replica in started:
            node = change.replica // per_node
            copies[node] += [(started.pop(change.replica), 1), (change.time_s, -1)]
            resident += 1
        elif change.state is DraftState.OFFLOADING:
            resident -= 1
            if resident < fewest:
                fewest, fewest_s = resident, change.time_s
    most_at_once = 0
    for events in copies.values():
        live = 0
        for _, delta in sorted(events):
            live += delta
            most_at_once = max(most_at_once, live)
    waits = [r.resident_s - r.wanted_s for r in memory.reloads if r.resident_s is not None]
    return {
        "num_offloads": float(sum(c.state is DraftState.OFFLOADING for c in memory.changes)),
        "num_reloads": float(len(memory.reloads)),
        "most_reloads_at_once_per_node": float(most_at_once),
        "fewest_resident": float(fewest),
        "fewest_resident_at_s": fewest_s,
        "min_resident_floor": float(result.resolved.scenario.memory.min_resident),
        "mean_reload_wait_s": sum(waits) / len(waits) if waits else 0.0,
        "max_reload_wait_s": max(waits, default=0.0),
    }


def run(num_replicas: int, duration_s: float, seed: int, workers: int = 1, policy: str = "adaptive") -> dict[str, Any]:
    scenario = cluster_slice(load_scenario(SCENARIO), num_replicas, duration_s)
    workers = min(workers, num_nodes(num_replicas, scenario.memory.replicas_per_node))
    wall, cpu = time.perf_counter(), time.process_time()
    result = simulate(scenario, policy, seed, workers=workers)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    summary = summarize(result)
    steps, replica_s = summary["num_steps"], summary["run_s"] * num_replicas
    row = {
        "replicas": num_replicas,
        "arrivals_s": duration_s,
        "policy": policy,
        "workers": workers,
        "simulated_s": summary["run_s"],
        "wall_s": wall,
        "cpu_s": cpu,
        "steps": steps,
        "us_per_step": 1e6 * wall / steps,
        "cpu_us_per_step": 1e6 * cpu / steps,
        "steps_per_replica_s": steps / replica_s,
        "replica_s_per_wall_s": replica_s / wall,
        "requests": summary["num_requests"],
        "throughput_tok_s": summary["throughput_tok_s"],
        "mean_k": summary["mean_k"],
        "mean_ttft_s": summary["mean_ttft_s"],
        "mean_tpot_s": summary["mean_tpot_s"],
        **memory_stats(result),
    }
    print(
        f"{num_replicas:3d} replicas x {duration_s:6.0f} s on {workers} process(es): wall {wall:7.1f} s "
        f"(cpu {cpu:7.1f})  steps {steps:9d}  "
        f"{row['us_per_step']:5.0f} us/step  {row['replica_s_per_wall_s']:6.1f} replica-s per wall s  "
        f"offloads {row.get('num_offloads', 0):.0f} reloads {row.get('num_reloads', 0):.0f} "
        f"most at once/node {row.get('most_reloads_at_once_per_node', 0):.0f} "
        f"fewest resident {row.get('fewest_resident', 0):.0f} (floor {row.get('min_resident_floor', 0):.0f})",
        file=sys.stderr,
        flush=True,
    )
    return row


def hour_estimate(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The 64-replica hour's wall: measured if run, else the 1-replica hour's steps per replica-second x 64 x 3,600
    x the largest run's microseconds per step."""
    full = [r for r in rows if r["replicas"] == 64 and r["arrivals_s"] >= HOUR_S]
    if full:
        return {"wall_s": full[0]["wall_s"], "measured": 1.0}
    hour = [r for r in rows if r["arrivals_s"] >= HOUR_S]
    if not hour:
        return None
    largest = max(rows, key=lambda r: r["replicas"])
    steps = hour[0]["steps_per_replica_s"] * 64 * HOUR_S
    return {"wall_s": steps * largest["us_per_step"] * 1e-6, "steps": steps, "measured": 0.0}


def plot(rows: list[dict[str, Any]], policy: str, path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    labels = [f"{r['replicas']} x {r['arrivals_s']:.0f} s, {r.get('workers', 1)} proc." for r in rows]
    left.bar(labels, [r["us_per_step"] for r in rows], color="tab:blue")
    left.set_ylabel("wall us per simulated step")
    left.set_title("cost per step")
    right.bar(labels, [r["replica_s_per_wall_s"] for r in rows], color="tab:green")
    right.axhline(64 * HOUR_S / 600, color="tab:red", linestyle="--", label="bar: 64 x 3,600 s in 600 s")
    right.set_ylabel("simulated replica-seconds per wall second")
    right.set_title("throughput")
    right.legend()
    for ax in (left, right):
        ax.tick_params(axis="x", rotation=20)
    fig.suptitle(f"{policy} on cluster-4090-7b-64x-hour (sim_scale.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_md(
    rows: list[dict[str, Any]], estimate: dict[str, Any] | None, policy: str, command: str, path: Path
) -> None:
    lines = [
        "# Simulator at cluster scale (issue 62, parts 4-5)",
        "",
        f"`{command}` on the 2-core development machine (shared with other benchmarks: wall times are noisy, CPU "
        f"times less so). Scenario: specserve/sim/scenarios/cluster-4090-7b-64x-hour.yaml, policy `{policy}`, "
        "seed 0; a run of N replicas keeps the load per replica (sim.cluster_slice). Processes: the processes that "
        "stepped the replicas (sim.parallel; CPU seconds are the calling process's).",
        "",
        "| replicas x arrivals | processes | simulated s | wall s | cpu s | steps | us/step | steps per replica-s | "
        "replica-s per wall s | offloads | reloads | most reloads at once on a node | fewest resident (floor) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['replicas']} x {r['arrivals_s']:.0f} s | {r.get('workers', 1)} | {r['simulated_s']:.0f} | "
            f"{r['wall_s']:.1f} | "
            f"{r['cpu_s']:.1f} | {r['steps']:,} | {r['us_per_step']:.0f} | {r['steps_per_replica_s']:.1f} | "
            f"{r['replica_s_per_wall_s']:.1f} | {r.get('num_offloads', 0):.0f} | {r.get('num_reloads', 0):.0f} | "
            f"{r.get('most_reloads_at_once_per_node', 0):.0f} | {r.get('fewest_resident', 0):.0f} "
            f"({r.get('min_resident_floor', 0):.0f}) |"
        )
    if estimate is not None:
        how = "measured" if estimate["measured"] else f"extrapolated from {estimate['steps']:,.0f} steps"
        lines += ["", f"64 replicas x 3,600 s: {estimate['wall_s'] / 60:.1f} min of wall ({how}); the bar is 10 min."]
    lines += ["", f"Raw data: [{path.stem}.json]({path.stem}.json).", "", f"![wall time per run]({path.stem}.png)"]
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="1:3600,8:600,64:240", help="replicas:arrival seconds, comma-separated")
    parser.add_argument("--full", action="store_true", help="also 64 replicas x 3,600 s")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1, help="processes per run, whole nodes each (sim.parallel)")
    parser.add_argument(
        "--policy", default="adaptive", help="the replicas' policy (fixed:k=3: the simulator's own cost)"
    )
    parser.add_argument("--out", default="bench/results/sim-scale")
    args = parser.parse_args()
    plan = [tuple(part.split(":")) for part in args.runs.split(",") if part]
    plan += [("64", str(HOUR_S))] if args.full else []
    rows = [run(int(n), float(seconds), args.seed, args.workers, args.policy) for n, seconds in plan]
    estimate = hour_estimate(rows)
    out = Path(args.out)
    command = "bench/sim_scale.py " + " ".join(sys.argv[1:])
    out.with_suffix(".json").write_text(json.dumps({"command": command, "runs": rows, "hour_64": estimate}, indent=2))
    write_md(rows, estimate, args.policy, command, out.with_suffix(".md"))
    plot(rows, args.policy, out.with_suffix(".png"))
    if estimate is not None:
        print(f"64 x 3,600 s: {estimate['wall_s'] / 60:.1f} min of wall", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

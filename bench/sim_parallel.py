"""The simulator on two processes against one (issue 62, part 4): wall time, and whether the statistics agree.

    .venv/bin/python bench/sim_parallel.py [--replicas 64] [--seconds 240] [--seeds 0,1,2] [--workers 2]
        [--sync-s 0.02] [--out bench/results/sim-parallel]

Runs a slice of specserve/sim/scenarios/cluster-4090-7b-64x-hour.yaml (``sim.cluster_slice``) under ``adaptive``
once per seed in one process and once in ``--workers`` processes (synced every ``--sync-s``, by default
``sim.parallel.DEFAULT_SYNC_S``), the two arms' order rotated from seed to seed. Per arm: wall seconds, and the
run's statistics (summary and draft memory). For each statistic: its mean over the seeds per arm, the mean of the
paired differences (parallel minus one process) with a 95 % t interval, and the spread from seed to seed of the
one-process runs (their standard deviation): a parallel run agrees within seed noise where the paired difference is
small beside that spread. Writes <out>.json, <out>.md and <out>.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only

import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_scale import SCENARIO, memory_stats  # noqa: E402

from specserve.bench.stats import mean_interval  # noqa: E402
from specserve.sim import load_scenario, simulate, summarize  # noqa: E402
from specserve.sim.cluster_slice import cluster_slice  # noqa: E402
from specserve.sim.parallel import DEFAULT_SYNC_S  # noqa: E402

METRICS = (
    "throughput_tok_s",
    "mean_e2e_s",
    "p99_e2e_s",
    "mean_ttft_s",
    "mean_tpot_s",
    "p99_tpot_s",
    "acceptance",
    "mean_k",
    "k_switches",
    "num_steps",
    "num_offloads",
    "num_reloads",
    "most_reloads_at_once_per_node",
    "fewest_resident",
    "mean_reload_wait_s",
)


def run(scenario: Any, seed: int, workers: int, sync_s: float) -> dict[str, Any]:
    wall = time.perf_counter()
    result = simulate(scenario, "adaptive", seed, workers=workers, sync_s=sync_s)
    wall = time.perf_counter() - wall
    row = {"seed": seed, "workers": workers, **summarize(result), **memory_stats(result), "wall_s": wall}
    print(
        f"seed {seed} workers {workers}: wall {wall:6.1f} s  steps {row['num_steps']:8d}  "
        f"mean E2E {row['mean_e2e_s']:.3f} s  mean k {row['mean_k']:.3f}  reloads {row.get('num_reloads', 0):.0f}",
        file=sys.stderr,
        flush=True,
    )
    return row


def interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95 % t interval."""
    i = mean_interval(values)
    return i.value, i.low, i.high


def compare(rows: list[dict[str, Any]], workers: int) -> dict[str, Any]:
    one = {r["seed"]: r for r in rows if r["workers"] == 1}
    many = {r["seed"]: r for r in rows if r["workers"] == workers}
    seeds = sorted(one)
    table = {}
    for name in METRICS:
        if name not in one[seeds[0]]:
            continue
        a, b = [float(one[s][name]) for s in seeds], [float(many[s][name]) for s in seeds]
        diff = interval([y - x for x, y in zip(a, b, strict=True)])
        table[name] = {
            "one_process": statistics.fmean(a),
            "parallel": statistics.fmean(b),
            "difference": diff,
            "seed_sd": statistics.stdev(a) if len(a) > 1 else 0.0,
        }
    speedup = interval([one[s]["wall_s"] / many[s]["wall_s"] for s in seeds])
    return {"metrics": table, "speedup": speedup, "seeds": seeds}


def plot(rows: list[dict[str, Any]], comparison: dict[str, Any], workers: int, path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    seeds = comparison["seeds"]
    for arm, color in ((1, "tab:blue"), (workers, "tab:green")):
        walls = [next(r["wall_s"] for r in rows if r["seed"] == s and r["workers"] == arm) for s in seeds]
        offset = -0.2 if arm == 1 else 0.2
        label = "1 process" if arm == 1 else f"{workers} processes"
        left.bar([i + offset for i in range(len(seeds))], walls, width=0.4, color=color, label=label)
    left.set_xticks(range(len(seeds)), [f"seed {s}" for s in seeds])
    left.set_ylabel("wall s")
    left.set_title("wall time per run")
    left.legend()
    names = list(comparison["metrics"])
    ratios = []
    for name in names:
        m = comparison["metrics"][name]
        scale = m["seed_sd"] if m["seed_sd"] > 0 else 1.0
        ratios.append(m["difference"][0] / scale)
    right.barh(names, ratios, color="tab:orange")
    right.axvline(-1, color="grey", linestyle="--")
    right.axvline(1, color="grey", linestyle="--")
    right.set_xlabel("mean paired difference / seed-to-seed SD (one process)")
    right.set_title("does a parallel run agree?")
    fig.suptitle(f"adaptive on cluster-4090-7b-64x-hour slices, 1 vs {workers} processes (sim_parallel.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_md(comparison: dict[str, Any], rows: list[dict[str, Any]], args: argparse.Namespace, command: str) -> None:
    path = Path(args.out).with_suffix(".md")
    low, mid, high = comparison["speedup"][1], comparison["speedup"][0], comparison["speedup"][2]
    lines = [
        "# The simulator on several processes (issue 62, part 4)",
        "",
        f"`{command}` on the 2-core development machine. Scenario: cluster-4090-7b-64x-hour, {args.replicas} "
        f"replicas x {args.seconds:.0f} s of arrivals (sim.cluster_slice), policy `adaptive`, seeds "
        f"{', '.join(map(str, comparison['seeds']))}; one process against {args.workers} synced every "
        f"{args.sync_s * 1000:g} ms (sim.parallel), order rotated by seed.",
        "",
        f"Wall-time speed-up: **{mid:.2f} x** [{low:.2f}, {high:.2f}] (mean and 95 % t interval over the seeds).",
        "",
        "| seed | 1 process, wall s | parallel, wall s | steps (1 / parallel) |",
        "|---|---|---|---|",
    ]
    for seed in comparison["seeds"]:
        a = next(r for r in rows if r["seed"] == seed and r["workers"] == 1)
        b = next(r for r in rows if r["seed"] == seed and r["workers"] == args.workers)
        lines.append(f"| {seed} | {a['wall_s']:.1f} | {b['wall_s']:.1f} | {a['num_steps']:,} / {b['num_steps']:,} |")
    lines += [
        "",
        "| statistic | 1 process (mean) | parallel (mean) | paired difference [95 % CI] | seed-to-seed SD |",
        "|---|---|---|---|---|",
    ]
    for name, m in comparison["metrics"].items():
        d = m["difference"]
        lines.append(
            f"| {name} | {m['one_process']:.4g} | {m['parallel']:.4g} | {d[0]:+.4g} [{d[1]:+.4g}, {d[2]:+.4g}] | "
            f"{m['seed_sd']:.4g} |"
        )
    lines += ["", f"Raw data: [{path.stem}.json]({path.stem}.json).", "", f"![runs]({path.stem}.png)"]
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sync-s", type=float, default=DEFAULT_SYNC_S)
    parser.add_argument("--out", default="bench/results/sim-parallel")
    args = parser.parse_args()
    scenario = cluster_slice(load_scenario(SCENARIO), args.replicas, args.seconds)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    for i, seed in enumerate(seeds):
        arms = (1, args.workers) if i % 2 == 0 else (args.workers, 1)
        rows += [run(scenario, seed, arm, args.sync_s) for arm in arms]
    comparison = compare(rows, args.workers)
    command = "bench/sim_parallel.py " + " ".join(sys.argv[1:])
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"command": command, "runs": rows, **comparison}, indent=2))
    write_md(comparison, rows, args, command)
    plot(rows, comparison, args.workers, out.with_suffix(".png"))
    print(f"speed-up {comparison['speedup'][0]:.2f} x", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

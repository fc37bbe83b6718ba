"""Draft offload in the simulator: Nightjar's Table 8 / App. C shape (offload vs not, bursty 7B) and App. E
(four replicas on one node reloading together, coordinated by the cluster planner or not).

    .venv/bin/python lab/studies/draft_memory/memory_sim.py \
        [--seeds 0,1,2] [--policies bandit,adaptive] [--out bench/results]

Part 1 runs bench/scenarios/memory/nightjar-4090-7b-burst.yaml with and without draft offload under each policy.
"Saturated" throughput is output tokens over the steps that ran with requests waiting (the burst's backlog), each
run over its own such steps; whole-trace numbers are over every request. Part 2 runs the same scenario with four
replicas on one node (one host link) and four times the rate, reloads granted locally (each on its own trigger) or
by the planner (``memory.coordination: planner``). A reload's time runs from the pool's contraction (the replica
gives up its extra KV) to the draft being resident; "want to resident" starts when the reload trigger first held.
Prints one JSON line per run on stdout; progress on stderr; writes memory.md, memory.json and PNGs under --out.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specserve.sim import Scenario
from specserve.sim.config import BurstArrivals, PoissonArrivals
from specserve.sim.draft_memory import DraftMemorySim
from specserve.sim.kernel import SimResult
from specserve.sim.metrics import summarize
from specserve.sim.runner import simulate
from specserve.sim.scenario import load_scenario, resolve
from specserve.sim.steps import StepStats
from specserve.speculation import StepRecord

SCENARIO = Path(__file__).resolve().parent / "scenarios" / "memory" / "nightjar-4090-7b-burst.yaml"
NUM_REPLICAS = 4


@dataclass(slots=True)
class Steps:
    """Per step of every replica: start, duration, emitted tokens, waiting, k, pool size and use."""

    rows: list[tuple[int, float, float, int, int, int, int, int]] = field(default_factory=list)

    def __call__(self, record: StepRecord, stats: StepStats) -> None:
        self.rows.append(
            (
                stats.replica,
                record.now_s,
                record.duration_s,
                record.num_emitted_tokens,
                stats.num_waiting,
                record.k,
                stats.num_kv_blocks_total,
                stats.num_kv_blocks_used,
            )
        )

    def array(self) -> np.ndarray:
        return np.array(self.rows, dtype=float)


def variant(scenario: Scenario, **memory: object) -> Scenario:
    return scenario.model_copy(update={"memory": scenario.memory.model_copy(update=memory)})


def scaled(scenario: Scenario, factor: float, num_replicas: int) -> Scenario:
    arrivals = scenario.workload.arrivals
    rates = {"base_qps": arrivals.base_qps * factor, "peak_qps": arrivals.peak_qps * factor}  # type: ignore[union-attr]
    workload = scenario.workload.model_copy(update={"arrivals": arrivals.model_copy(update=rates)})
    return scenario.model_copy(update={"workload": workload, "num_replicas": num_replicas})


def overloaded(scenario: Scenario) -> Scenario:
    """The burst's peak rate held for twice the burst's length from t = 0: saturated from start to drain
    (Nightjar §8.3.2, Fig. 14 measures offload at static rates past saturation)."""
    arrivals = scenario.workload.arrivals
    steady = {"kind": "poisson", "rate_qps": arrivals.peak_qps, "duration_s": 2 * arrivals.burst_duration_s}  # type: ignore[union-attr]
    workload = scenario.workload.model_copy(update={"arrivals": PoissonArrivals(**steady)})
    return scenario.model_copy(update={"workload": workload})


def run_metrics(result: SimResult, steps: Steps) -> dict:
    s = summarize(result)
    table, rows = result.table, steps.array()
    ttft = table.first_token_s - table.arrival_s
    backlog = rows[rows[:, 4] > 0]
    arrivals = result.resolved.scenario.workload.arrivals
    if isinstance(arrivals, BurstArrivals):
        start, length = arrivals.burst_start_s, arrivals.burst_duration_s
    else:
        start, length = 0.0, result.end_s
    in_burst = rows[(rows[:, 1] >= start) & (rows[:, 1] < start + length)]
    memory = result.memory
    out = {
        "throughput_tok_s": s["throughput_tok_s"],
        "backlog_s": float(backlog[:, 2].sum()),
        # Per replica: every replica's tokens over the burst's seconds.
        "burst_tok_s": float(in_burst[:, 3].sum() / length / result.resolved.scenario.num_replicas),
        "mean_e2e_s": s["mean_e2e_s"],
        "p99_ttft_s": float(np.percentile(ttft, 99)),
        "mean_ttft_s": s["mean_ttft_s"],
        "mean_k": s["mean_k"],
        "num_requests": s["num_requests"],
        "num_preemptions": s["num_preemptions"],
        "max_kv_blocks_used": int(rows[:, 7].max()),
        "num_offloads": sum(c.state.value == "offloading" for c in memory.changes) if memory else 0,
        "reloads": [
            {
                "replica": r.replica,
                "reload_s": (r.resident_s or np.nan) - r.contraction_s,
                "want_to_resident_s": (r.resident_s or np.nan) - r.wanted_s,
                "contraction_s": r.contraction_s,
                "resident_s": r.resident_s,
                "moved_blocks": r.num_moved_blocks,
            }
            for r in (memory.reloads if memory else [])
        ],
    }
    return out


def one_run(scenario: Scenario, policy: str, seed: int, label: str) -> tuple[dict, Steps]:
    steps = Steps()
    result = simulate(scenario, policy, seed, on_step=steps)
    metrics = run_metrics(result, steps)
    print(json.dumps({"run": label, "policy": policy, "seed": seed, **metrics}), flush=True)
    print(f"  {label} {policy} seed {seed}: {result.wall_s:.1f} s", file=sys.stderr, flush=True)
    return metrics, steps


def mean(runs: list[dict], key: str) -> float:
    return float(np.mean([r[key] for r in runs]))


def max_overlap(reloads: list[dict]) -> int:
    edges = sorted([(r["contraction_s"], 1) for r in reloads] + [(r["resident_s"], -1) for r in reloads])
    depth = peak = 0
    for _, delta in edges:
        depth += delta
        peak = max(peak, depth)
    return peak


class IdleReplica:
    """Just what DraftMemorySim reads of a replica: a pool whose use the storm sets directly."""

    def __init__(self, index: int, num_blocks: int) -> None:
        self.index = index
        self.series_k = [0]
        self.waiting: list[int] = []
        self.batch: list[int] = []
        self.num_kv_blocks_total = self.num_kv_blocks_free = num_blocks
        self.memory = None

    def resize_pool(self, num_blocks: int) -> None:
        self.num_kv_blocks_total += num_blocks
        self.num_kv_blocks_free += num_blocks

    def draft_reloaded(self) -> None:
        pass


def reload_storm(scenario: Scenario, num_replicas: int, mode: str, step_s: float = 0.03) -> list[dict]:
    """Replicas on one node under the same load: full (k = 0, a queue) for 1 s, then idle, stepping every
    ``step_s``; the same machines, link and planner as the simulator, so every reload trigger holds at once."""
    scen = variant(scenario, offload=True, replicas_per_node=num_replicas, coordination=mode)
    resolved = resolve(scen.model_copy(update={"num_replicas": num_replicas}))
    replicas = [IdleReplica(i, resolved.num_kv_blocks) for i in range(num_replicas)]
    memory = DraftMemorySim(scen.memory, resolved, replicas)  # type: ignore[arg-type]
    wakes: list[float] = []
    t = 0.0
    while t < 10.0 and len(memory.reloads) < num_replicas:
        busy = t < 1.0
        for r in replicas:
            r.waiting = [0] if busy else []
            r.num_kv_blocks_free = 0 if busy else r.num_kv_blocks_total
            for wake_s in memory.after_step(r, t):  # type: ignore[arg-type]
                heapq.heappush(wakes, wake_s)
        t += step_s
        while wakes and wakes[0] <= t:
            for wake_s in memory.on_wake(heapq.heappop(wakes)):
                heapq.heappush(wakes, wake_s)
    return [
        {
            "reload_s": (r.resident_s or np.nan) - r.contraction_s,
            "want_to_resident_s": (r.resident_s or np.nan) - r.wanted_s,
        }
        for r in memory.reloads
    ]


def parse_runs(description: str | None) -> tuple[list[int], list[str], Path]:
    """The seeds, policies and output folder a memory benchmark runs with (its command line)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--policies", default="bandit,adaptive")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()
    return [int(s) for s in args.seeds.split(",")], args.policies.split(","), Path(args.out)


def main() -> None:
    seeds, policies, out = parse_runs(__doc__)
    out.mkdir(parents=True, exist_ok=True)
    base = load_scenario(str(SCENARIO))

    print("part 1: offload vs not", file=sys.stderr)
    table8: dict[str, dict[str, list[dict]]] = {}
    timelines: dict[str, Steps] = {}
    for policy in policies:
        table8[policy] = {}
        for offload in (False, True):
            label = "offload" if offload else "no-offload"
            runs = []
            for seed in seeds:
                metrics, steps = one_run(variant(base, offload=offload), policy, seed, label)
                runs.append(metrics)
                if seed == seeds[0] and policy == policies[0]:
                    timelines[label] = steps
            table8[policy][label] = runs
            table8[policy][f"overload-{label}"] = [
                one_run(variant(overloaded(base), offload=offload), policy, seed, f"overload-{label}")[0]
                for seed in seeds
            ]

    print("part 2: four replicas on one node reloading", file=sys.stderr)
    cluster = scaled(base, NUM_REPLICAS, NUM_REPLICAS)
    coordination: dict[str, list[dict]] = {}
    for mode in ("local", "planner"):
        scen = variant(cluster, offload=True, replicas_per_node=NUM_REPLICAS, coordination=mode)
        coordination[mode] = [one_run(scen, policies[0], seed, f"4x-{mode}")[0] for seed in seeds]

    print("part 3: reload storms", file=sys.stderr)
    storms = {
        f"{n}-{mode}": reload_storm(base, n, mode)
        for n in (2, NUM_REPLICAS, 2 * NUM_REPLICAS)
        for mode in ("local", "planner")
    }
    command = "python lab/studies/draft_memory/memory_sim.py " + " ".join(sys.argv[1:])
    results = {"table8": table8, "coordination": coordination, "storms": storms}
    (out / "memory.json").write_text(json.dumps(results, indent=1))
    write_report(out, command.strip(), base, cluster, table8, coordination, storms, seeds, policies[0])
    plot_timeline(out / "memory-timeline.png", timelines, base)
    plot_reloads(out / "memory-reloads.png", coordination)
    print(f"wrote {out / 'memory.md'}", file=sys.stderr)


def write_report(
    out: Path,
    command: str,
    base: Scenario,
    cluster: Scenario,
    table8: dict[str, dict[str, list[dict]]],
    coordination: dict[str, list[dict]],
    storms: dict[str, list[dict]],
    seeds: list[int],
    policy: str,
) -> None:
    lines = [
        "# Draft offload in the simulator (Nightjar Table 8, App. C and App. E shape)",
        "",
        f"Generated by `{command}` (seeds {', '.join(map(str, seeds))}; numbers are means over seeds).",
        "",
        f"Scenario: `bench/scenarios/memory/{SCENARIO.name}`. {base.description}",
        "",
        "## Offload vs no offload, one replica",
        "",
        "burst: the burst-spike trace; burst-window tok/s counts output tokens of the steps that started in the "
        "spike's 30 s. overload: the spike's rate held from t = 0 for 60 s, so the replica is saturated until it "
        "drains and whole-run tok/s is its service rate (Nightjar Fig. 14's static rates). backlog s: step time "
        "with requests waiting.",
        "",
        "| policy | run | burst-window tok/s | whole-run tok/s | mean E2E s | p99 TTFT s | mean TTFT s | backlog s | "
        "offloads | reloads | peak KV blocks used | preemptions |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for pol, variants in table8.items():
        for label, runs in variants.items():
            run = label if label.startswith("overload") else f"burst-{label}"
            lines.append(
                f"| `{pol}` | {run} | {mean(runs, 'burst_tok_s'):.0f} | {mean(runs, 'throughput_tok_s'):.0f} | "
                f"{mean(runs, 'mean_e2e_s'):.2f} | {mean(runs, 'p99_ttft_s'):.2f} | {mean(runs, 'mean_ttft_s'):.2f} | "
                f"{mean(runs, 'backlog_s'):.1f} | {mean(runs, 'num_offloads'):.1f} | "
                f"{np.mean([len(r['reloads']) for r in runs]):.1f} | {mean(runs, 'max_kv_blocks_used'):.0f} | "
                f"{mean(runs, 'num_preemptions'):.0f} |"
            )
    lines += [
        "",
        "Ratios, offload over no offload (the bars: throughput >= 1.05 while the burst saturates the replica, "
        "read in the burst's window and, stricter, at the held rate; mean E2E and p99 TTFT over the whole trace < 1):",
        "",
        "| policy | overload tok/s | burst-window tok/s | burst whole-trace tok/s | burst mean E2E | burst p99 TTFT |",
        "|---|---|---|---|---|---|",
    ]
    for pol, variants in table8.items():
        on, off = variants["offload"], variants["no-offload"]
        over = mean(variants["overload-offload"], "throughput_tok_s") / mean(
            variants["overload-no-offload"], "throughput_tok_s"
        )
        ratio = {k: mean(on, k) / mean(off, k) for k in ("burst_tok_s", "throughput_tok_s", "mean_e2e_s", "p99_ttft_s")}
        lines.append(
            f"| `{pol}` | {over:.3f} | {ratio['burst_tok_s']:.3f} | {ratio['throughput_tok_s']:.3f} | "
            f"{ratio['mean_e2e_s']:.3f} | {ratio['p99_ttft_s']:.3f} |"
        )
    lines += [
        "",
        f"## Four replicas on one node reloading (`{policy}`)",
        "",
        f"{NUM_REPLICAS} replicas share one host link ({cluster.hardware}), the arrival rates times {NUM_REPLICAS}. "
        "local: each replica reloads on its own trigger; planner: the cluster planner grants reloads "
        "(slots per node from bandwidth and draft size, `max_reload_s` 0.1 s).",
        "",
        "| coordination | reloads | most at once | p99 reload s | mean reload s | p99 want->resident s | "
        "mean want->resident s | tok/s | mean E2E s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, runs in coordination.items():
        reloads = [r for run in runs for r in run["reloads"]]
        times = np.array([r["reload_s"] for r in reloads])
        waits = np.array([r["want_to_resident_s"] for r in reloads])
        most = max((max_overlap(run["reloads"]) for run in runs if run["reloads"]), default=0)
        lines.append(
            f"| {mode} | {len(reloads)} | {most} | {np.percentile(times, 99):.3f} | {times.mean():.3f} | "
            f"{np.percentile(waits, 99):.3f} | {waits.mean():.3f} | {mean(runs, 'throughput_tok_s'):.0f} | "
            f"{mean(runs, 'mean_e2e_s'):.2f} |"
        )
    lines += [
        "",
        "## Reload storms: replicas on one node whose reload triggers hold at the same step",
        "",
        "The same state machines, host link and planner, driven by a load that is full (k = 0, a queue) for 1 s and "
        "then idle, so every replica wants its draft back at once (Nightjar App. E's concurrent transfers).",
        "",
        "| replicas | coordination | p99 reload s | mean reload s | p99 want->resident s | mean want->resident s |",
        "|---|---|---|---|---|---|",
    ]
    for key, reloads in storms.items():
        n, mode = key.split("-")
        times = np.array([r["reload_s"] for r in reloads])
        waits = np.array([r["want_to_resident_s"] for r in reloads])
        lines.append(
            f"| {n} | {mode} | {np.percentile(times, 99):.3f} | {times.mean():.3f} | {np.percentile(waits, 99):.3f} | "
            f"{waits.mean():.3f} |"
        )
    lines += [
        "",
        "Reading: a reload is the contraction's device-local time (Nightjar App. C: 306 ms) plus the copy, which "
        "alone takes the draft's bytes over the link and n times that when n copies share it (App. E). Most at "
        "once counts overlapping contraction-to-resident spans, not overlapping copies. Sharing the link is "
        "work-conserving, so no grant order finishes a set of simultaneous reloads sooner: the planner keeps each "
        "reload short (less time with neither the extra KV nor the draft) and lets queued replicas keep their "
        "expanded pool meanwhile, and the queued ones get their draft later. Want-to-resident includes the "
        "drain-aware wait before contraction (up to `drain_timeout_s`).",
        "",
        "![timeline](memory-timeline.png)",
        "![reloads](memory-reloads.png)",
        "",
    ]
    (out / "memory.md").write_text("\n".join(lines))


def plot_timeline(path: Path, timelines: dict[str, Steps], base: Scenario) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_kv, ax_k) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for label, steps in timelines.items():
        rows = steps.array()
        ax_kv.plot(rows[:, 1], rows[:, 7], label=f"{label}: blocks used", lw=0.8)
        ax_kv.plot(rows[:, 1], rows[:, 6], label=f"{label}: pool size", lw=1.5, ls="--")
        ax_k.plot(rows[:, 1], rows[:, 5], label=label, lw=0.6, alpha=0.7)
    arrivals = base.workload.arrivals
    for ax in (ax_kv, ax_k):
        start = arrivals.burst_start_s  # type: ignore[union-attr]
        ax.axvspan(start, start + arrivals.burst_duration_s, color="grey", alpha=0.15)  # type: ignore[union-attr]
    ax_kv.set_ylabel("KV blocks")
    ax_kv.legend(fontsize=7)
    ax_k.set_ylabel("k")
    ax_k.set_xlabel("time (s); grey: the burst")
    ax_k.legend(fontsize=7)
    fig.suptitle("Burst spike, seed 0: the pool grows by the draft's blocks while offloaded")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_reloads(path: Path, coordination: dict[str, list[dict]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (mode, runs) in enumerate(coordination.items()):
        times = sorted(r["reload_s"] for run in runs for r in run["reloads"])
        waits = sorted(r["want_to_resident_s"] for run in runs for r in run["reloads"])
        ax.scatter([i - 0.1] * len(times), times, label=f"{mode}: contraction to resident", marker="o")
        ax.scatter([i + 0.1] * len(waits), waits, label=f"{mode}: want to resident", marker="x")
    ax.set_xticks(range(len(coordination)), list(coordination))
    ax.set_ylabel("seconds")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.set_title(f"{NUM_REPLICAS} replicas on one node: reload times per reload")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()

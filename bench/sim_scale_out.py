"""What a new replica's acceptance prior buys in a scale-out, in the simulator.

    .venv/bin/python bench/sim_scale_out.py [--seeds 0,1,2] [--replicas N] [--out bench/results/sim-scale-out]

Runs specserve/sim/scenarios/cluster-4090-7b-scale-out.yaml (16 replicas, then 16 more join when the load doubles)
under ``adaptive`` with ``scale_out.priors`` on and off, per seed (the same requests and verdict streams both ways).
Per run: the new replicas' mean k over their first 20 speculating-or-not decode steps and over their first 10 s,
the output tokens they emitted in their first 10 s, and the cluster's throughput and mean TTFT. Writes <out>.json,
<out>.md and <out>.png (the new replicas' mean k against time since they joined, seed 0).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only

import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend

from specserve.sim import SimResult, load_scenario, simulate, summarize  # noqa: E402
from specserve.sim.cluster_slice import cluster_slice  # noqa: E402

SCENARIO = "cluster-4090-7b-scale-out"
FIRST_STEPS = 20
FIRST_S = 10.0


def joiners(result: SimResult):
    scale_out = result.resolved.scenario.scale_out
    assert scale_out is not None
    return result.replicas[len(result.replicas) - scale_out.replicas :], scale_out.at_s


def row(result: SimResult, priors: bool, seed: int) -> dict:
    new, at_s = joiners(result)
    first_steps = [k for r in new for k in r.series_k[1 : 1 + FIRST_STEPS]]  # after each one's first (prefill) step
    first_s = [k for r in new for t, k in zip(r.series_time_s, r.series_k, strict=True) if t < at_s + FIRST_S]
    tokens = sum(n for r in new for t, n in zip(r.series_end_s, r.series_tokens, strict=True) if t < at_s + FIRST_S)
    summary = summarize(result)
    return {
        "seed": seed,
        "priors": priors,
        "new_mean_k_first_steps": round(statistics.fmean(first_steps), 3),
        "new_mean_k_first_s": round(statistics.fmean(first_s), 3),
        "new_tokens_first_s": tokens,
        "throughput_tok_s": round(summary["throughput_tok_s"], 1),
        "mean_ttft_s": round(summary["mean_ttft_s"], 4),
        "wall_s": round(result.wall_s, 1),
    }


def k_curve(result: SimResult, bins_s: float = 1.0, span_s: float = 30.0) -> tuple[list[float], list[float]]:
    new, at_s = joiners(result)
    sums: dict[int, list[int]] = {}
    for r in new:
        for t, k in zip(r.series_time_s, r.series_k, strict=True):
            if at_s <= t < at_s + span_s:
                sums.setdefault(int((t - at_s) / bins_s), []).append(k)
    xs = sorted(sums)
    return [x * bins_s for x in xs], [statistics.fmean(sums[x]) for x in xs]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", default="bench/results/sim-scale-out")
    parser.add_argument(
        "--replicas", type=int, help="run it on fewer replicas at the same load each (sim.cluster_slice)"
    )
    args = parser.parse_args()
    base = load_scenario(SCENARIO)
    if args.replicas is not None:
        base = cluster_slice(base, args.replicas)
    assert base.scale_out is not None
    rows, curves = [], {}
    for seed in (int(s) for s in args.seeds.split(",")):
        for priors in (True, False):
            scenario = base.model_copy(update={"scale_out": base.scale_out.model_copy(update={"priors": priors})})
            result = simulate(scenario, "adaptive", seed)
            rows.append(row(result, priors, seed))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            if seed == 0:
                curves[priors] = k_curve(result)
    out = Path(args.out)
    document = {"command": "bench/sim_scale_out.py " + " ".join(sys.argv[1:]), "scenario": SCENARIO, "rows": rows}
    out.with_suffix(".json").write_text(json.dumps(document, indent=1) + "\n")
    lines = [
        "# A scale-out's acceptance prior in the simulator",
        "",
        f"`{document['command'].strip()}`: {SCENARIO}, `adaptive`; new replicas' mean k over their first "
        f"{FIRST_STEPS} steps and first {FIRST_S:.0f} s, their output tokens in those seconds, the cluster's "
        "throughput and mean TTFT.",
        "",
        "| seed | priors | new: mean k, first steps | new: mean k, first 10 s | new: tokens, first 10 s "
        "| tok/s | TTFT s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['seed']} | {'on' if r['priors'] else 'off'} | {r['new_mean_k_first_steps']} | "
            f"{r['new_mean_k_first_s']} | {r['new_tokens_first_s']:,} | {r['throughput_tok_s']:,} | "
            f"{r['mean_ttft_s']} |"
        )
    lines += ["", f"Raw data: [{out.stem}.json]({out.stem}.json).", "", f"![new replicas' mean k]({out.stem}.png)"]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for priors, (xs, ys) in curves.items():
        ax.plot(xs, ys, "o-" if priors else "s--", label="seeded with peers' evidence" if priors else "cold prior")
    ax.set_xlabel("seconds since the new replicas joined")
    ax.set_ylabel("new replicas' mean k")
    ax.set_title("scale-out, seed 0")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    print(f"wrote {out.with_suffix('.json')}, .md and .png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Issue 61's simulator bar for ``adaptive``'s per-request caps: on the mixed-acceptance scenario
(``mixed-ngram-h100-8b``: 30 % copy-heavy requests at alpha 0.9, 70 % free-form at 0.25) held at each of its three
rates for 60 s of Poisson arrivals, ``adaptive`` (per-request caps) against ``adaptive:per_request=false`` (one batch
k), ``fixed:k=0`` beside them, over ``--seeds`` seeds. Each seed runs the very same requests under every policy
(kernel.py's streams), so the ratio is taken per seed and its mean given with a 95 % t-interval.

The bar: goodput at least 1.05x the one-k baseline's at the highest rate, and no worse (ratio interval not wholly
below 1) at the others. Goodput is the simulator's ``goodput_tok_s``: output tokens over the run, drain included (the
scenario has no SLO). Prints the table and writes ``--out``.{md,json,png}.

    PYTHONPATH=$PWD .venv/bin/python lab/studies/per_request/per_request_bar.py [--seeds 5] \
        [--out bench/results/per-request-bar]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lab.experiments.leaderboard import at_static_rate  # noqa: E402
from specserve.bench.stats import T95  # noqa: E402
from specserve.sim import simulate, summarize  # noqa: E402
from specserve.sim.config import PiecewiseArrivals  # noqa: E402
from specserve.sim.scenario import load_scenario  # noqa: E402

SCENARIO = "mixed-ngram-h100-8b"
WINDOW_S = 60.0
PER_REQUEST, ONE_K, NO_SPEC = "adaptive:per_request=true", "adaptive:per_request=false", "fixed:k=0"
POLICIES = (PER_REQUEST, ONE_K, NO_SPEC)
KEYS = ("goodput_tok_s", "mean_e2e_s", "p99_e2e_s", "mean_tpot_s", "mean_k", "acceptance", "wall_s")
BAR_RATIO = 1.05


def rates() -> list[float]:
    arrivals = load_scenario(SCENARIO).workload.arrivals
    assert isinstance(arrivals, PiecewiseArrivals)
    return [segment.rate_qps for segment in arrivals.segments]


def run(job: tuple[float, str, int]) -> dict:
    rate, policy, seed = job
    summary = summarize(simulate(at_static_rate(load_scenario(SCENARIO), rate, WINDOW_S), policy, seed))
    return {key: summary[key] for key in KEYS}


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % t-interval."""
    mean = statistics.mean(values)
    if len(values) < 2:
        return mean, math.inf
    return mean, T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", default="bench/results/per-request-bar")
    parser.add_argument("--rates", help="other rates (QPS, comma-separated) instead of the scenario's: not the bar")
    args = parser.parse_args()
    loads = [float(r) for r in args.rates.split(",")] if args.rates else rates()
    jobs = [(rate, policy, seed) for rate in loads for policy in POLICIES for seed in range(args.seeds)]
    with ProcessPoolExecutor(2) as pool:
        results = dict(zip(jobs, pool.map(run, jobs), strict=True))
    rows = []
    for rate in loads:
        by = {p: [results[(rate, p, s)] for s in range(args.seeds)] for p in POLICIES}
        ratio = [a["goodput_tok_s"] / b["goodput_tok_s"] for a, b in zip(by[PER_REQUEST], by[ONE_K], strict=True)]
        e2e = [a["mean_e2e_s"] / b["mean_e2e_s"] for a, b in zip(by[PER_REQUEST], by[ONE_K], strict=True)]
        row: dict = {"rate_qps": rate, "goodput_ratio": interval(ratio), "mean_e2e_ratio": interval(e2e)}
        row["policies"] = {p: {k: statistics.mean(r[k] for r in runs) for k in KEYS} for p, runs in by.items()}
        rows.append(row)
    highest = rows[-1]["goodput_ratio"]
    passes = highest[0] - highest[1] >= BAR_RATIO and all(
        r["goodput_ratio"][0] + r["goodput_ratio"][1] >= 1.0 for r in rows
    )
    command = f"PYTHONPATH=$PWD .venv/bin/python lab/studies/per_request/per_request_bar.py --seeds {args.seeds}"
    if args.rates:
        command += f" --rates {args.rates} --out {args.out}"
    text = report(rows, args.seeds, command, passes, bar=not args.rates)
    print(text)
    out = Path(args.out)
    stem = out.stem
    text += f"\nRaw data: [{stem}.json]({stem}.json).\n\n![goodput and mean E2E ratios per rate]({stem}.png)\n"
    out.with_suffix(".md").write_text(text)
    record = {"command": command, "scenario": SCENARIO, "window_s": WINDOW_S, "seeds": args.seeds, "passes": passes}
    out.with_suffix(".json").write_text(json.dumps(record | {"rows": rows}, indent=2) + "\n")
    plot(rows, out.with_suffix(".png"))


def report(rows: list[dict], seeds: int, command: str, passes: bool, bar: bool) -> str:
    verdict = f"**{'passes' if passes else 'fails'}**" if bar else "not judged: these are not the scenario's rates"
    lines = [
        f"# adaptive per-request caps against one batch k ({SCENARIO})",
        "",
        f"`{command}`: each rate held for {WINDOW_S:.0f} s of Poisson arrivals, {seeds} seeds; ratios are per seed "
        f"(the same requests under both policies), mean ± 95 % t-interval. Bar: goodput >= {BAR_RATIO}x at the "
        f"highest rate (the interval's lower end), no worse at the others: {verdict}.",
        "",
        "| QPS | goodput ratio | mean E2E ratio | goodput tok/s (per-request / one k / k=0) | mean E2E s "
        "(per-request / one k / k=0) | mean k (per-request / one k) | sim wall s (per-request / one k) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r["policies"]
        goodputs = " / ".join(f"{p[x]['goodput_tok_s']:.0f}" for x in POLICIES)
        e2es = " / ".join(f"{p[x]['mean_e2e_s']:.2f}" for x in POLICIES)
        lines.append(
            f"| {r['rate_qps']:g} | {r['goodput_ratio'][0]:.3f} ± {r['goodput_ratio'][1]:.3f} "
            f"| {r['mean_e2e_ratio'][0]:.3f} ± {r['mean_e2e_ratio'][1]:.3f} "
            f"| {goodputs} | {e2es} "
            f"| {p[PER_REQUEST]['mean_k']:.2f} / {p[ONE_K]['mean_k']:.2f} "
            f"| {p[PER_REQUEST]['wall_s']:.1f} / {p[ONE_K]['wall_s']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    x = range(len(rows))
    for offset, key, label in ((-0.15, "goodput_ratio", "goodput"), (0.15, "mean_e2e_ratio", "mean E2E")):
        means = [r[key][0] for r in rows]
        errors = [r[key][1] for r in rows]
        ax.bar([i + offset for i in x], means, 0.3, yerr=errors, capsize=4, label=label)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(BAR_RATIO, color="red", lw=0.8, ls="--", label=f"bar {BAR_RATIO}x (goodput, highest rate)")
    ax.set_xticks(list(x), [f"{r['rate_qps']:g} QPS" for r in rows])
    ax.set_ylabel("per-request / one batch k")
    ax.set_title(f"adaptive per-request caps, {SCENARIO}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()

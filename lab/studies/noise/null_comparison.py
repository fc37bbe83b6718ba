"""What `bench compare` reads for a policy exactly as good as the best fixed k, given this machine's noise.

    PYTHONPATH=$PWD .venv/bin/python lab/studies/noise/null_comparison.py \
        --pages bench/results/cpu-perf-S-c*-30s*.json [--sigma S] [--tied 1,2,3] [--rounds 5,8,16,32] \
        [--trials 1000] [--bar 0.97] [--out bench/results/null_comparison]

Every run's rate is its policy's true rate times independent log-normal noise of spread ``sigma`` (estimated,
unless given, from committed comparisons: the spread over rounds of the log ratio of two fixed policies in the
same round, divided by sqrt 2, median over every pair of every page). ``tied`` fixed policies share the best
rate, and the policy under test has that rate too. ``lab.instruments.noise`` then applies the statistics of
every results page (the best fixed picked within rounds, the median per-round ratio and its paired bootstrap
interval). With more than one tied fixed policy the one picked as best is the one the noise favoured, so an
equal policy reads below 1 on average (the winner's curse), and below ``--bar`` in some share of invocations.
Prints a table, writes PREFIX.json and PREFIX.png.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from lab.instruments.noise import equal_policy_readings, per_run_spreads


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", nargs="*", default=[], help="`bench compare` JSONs to estimate the noise from")
    parser.add_argument("--sigma", type=float, help="per-run noise (log scale) instead of the pages' estimate")
    parser.add_argument("--tied", default="1,2,3", help="how many fixed policies share the best rate")
    parser.add_argument("--rounds", default="5,8,16,32")
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--bar", type=float, default=0.97)
    parser.add_argument("--out", default="bench/results/null_comparison")
    args = parser.parse_args()
    if args.sigma is None and not args.pages:
        parser.error("give --pages to estimate the noise from, or --sigma")
    if args.sigma is not None:
        sigma, pairs = args.sigma, 0
    else:
        spreads = per_run_spreads(json.loads(Path(page).read_text()) for page in args.pages)
        if not spreads:
            parser.error("no page with two fixed policies over 3 rounds or more; give --sigma")
        sigma, pairs = float(np.median(spreads)), len(spreads)
    tied = [int(x) for x in args.tied.split(",")]
    rounds = [int(x) for x in args.rounds.split(",")]
    print(f"per-run noise {sigma:.4f} (log sd; {pairs} fixed pairs)" if pairs else f"per-run noise {sigma:.4f}")
    rng = np.random.default_rng(0)
    rows = []
    print(f"{'tied':>4} {'rounds':>6} {'mean ratio':>10} {'< bar':>6} {'low >= bar':>10}")
    for n in tied:
        for r in rounds:
            print(f"  tied {n}, {r} rounds ...", end="\r", file=sys.stderr, flush=True)
            got = equal_policy_readings(sigma, n, r, args.trials, args.resamples, rng)
            row = {
                "tied": n,
                "rounds": r,
                "mean_ratio": float(got[:, 0].mean()),
                "share_below_bar": float((got[:, 0] < args.bar).mean()),
                "share_low_at_or_above_bar": float((got[:, 1] >= args.bar).mean()),
            }
            rows.append(row)
            print(
                f"{n:>4} {r:>6} {row['mean_ratio']:>10.3f} {row['share_below_bar']:>6.2f} "
                f"{row['share_low_at_or_above_bar']:>10.2f}"
            )
    prefix = Path(args.out)
    document = {
        "command": "PYTHONPATH=$PWD .venv/bin/python lab/studies/noise/null_comparison.py " + " ".join(sys.argv[1:]),
        "sigma": sigma,
        "sigma_from_pairs": pairs,
        "pages": args.pages,
        "bar": args.bar,
        "trials": args.trials,
        "resamples": args.resamples,
        "rows": rows,
    }
    prefix.with_suffix(".json").write_text(json.dumps(document, indent=1) + "\n")
    plot(document, prefix.with_suffix(".png"))
    print(prefix.with_suffix(".json"), prefix.with_suffix(".png"), sep="\n")
    return 0


def plot(document: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    ticks = sorted({row["rounds"] for row in document["rows"]})
    for n in sorted({row["tied"] for row in document["rows"]}):
        rows = [row for row in document["rows"] if row["tied"] == n]
        rounds = [row["rounds"] for row in rows]
        label = f"{n} fixed k tied for best"
        left.plot(rounds, [row["share_below_bar"] for row in rows], marker="o", label=label)
        right.plot(rounds, [row["mean_ratio"] for row in rows], marker="o", label=label)
    left.set_ylabel(f"share of invocations read below {document['bar']}")
    right.set_ylabel("mean reported ratio")
    right.axhline(1.0, color="black", linewidth=0.8)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(r) for r in ticks])
        ax.minorticks_off()
        ax.set_xlabel("rounds per invocation")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"A policy exactly as good as the best fixed k, per-run noise {document['sigma']:.3f} "
        f"({document['trials']} invocations each)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())

"""What the start-up calibration does for a replica that starts under load, in the simulator: `adaptive` cold,
calibrated at the small batch sizes only (1, 4, 8), and calibrated up to max_num_seqs (the plan the engine runs),
beside every fixed k.

Llama-3.1-8B + 1B draft on one H100 (the method-draft-h100-8b-batch profile: k = 0 skips the draft's pass, acceptance
0.7), a closed loop of N clients from the first step for 40 s, drafts made a step ahead as vLLM makes them or in
the step that verifies them (the papers' model). One seed: the simulated GPU has no jitter, so a run is exact.

    PYTHONPATH=$PWD .venv/bin/python lab/studies/startup_calibration/cold_clients.py [--clients 4,64,256]
        [--out bench/results/startup-calibration-sim]

Writes PREFIX.json, PREFIX.md and PREFIX.png (tokens/s of each arm over the best fixed k's, per case).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from unittest import mock

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specserve.sim import load_scenario, simulate, summarize  # noqa: E402
from specserve.sim.config import Scenario  # noqa: E402
from specserve.speculation import startup_checks  # noqa: E402

FIXED = [f"fixed:k={k}" for k in range(5)]
ARMS = ["cold", "calibrated to 8", "calibrated to max_num_seqs"]


def case(clients: int, drafts_ahead: bool, calibrated: bool) -> Scenario:
    base = load_scenario("method-draft-h100-8b-batch")
    engine = base.engine.model_copy(update={"drafts_ahead": drafts_ahead, "startup_calibration": calibrated})
    arrivals = base.workload.arrivals.model_validate(
        {"kind": "clients", "phases": [{"clients": clients, "duration_s": 40}]}
    )
    return base.model_copy(
        update={"engine": engine, "workload": base.workload.model_copy(update={"arrivals": arrivals})}
    )


def throughput(scenario: Scenario, policy: str) -> float:
    return summarize(simulate(scenario, policy, 0))["throughput_tok_s"]


def run_case(clients: int, drafts_ahead: bool) -> dict:
    row: dict = {"clients": clients, "drafts_ahead": drafts_ahead}
    row["fixed"] = {p: throughput(case(clients, drafts_ahead, True), p) for p in FIXED}
    row["cold"] = throughput(case(clients, drafts_ahead, False), "adaptive")
    # The plan before it grew past the small batch sizes.
    with mock.patch.object(
        startup_checks, "batch_sizes", lambda n: tuple(min(b, n) for b in startup_checks.SMALL_BATCH_SIZES)
    ):
        row["calibrated to 8"] = throughput(case(clients, drafts_ahead, True), "adaptive")
    row["calibrated to max_num_seqs"] = throughput(case(clients, drafts_ahead, True), "adaptive")
    best = max(row["fixed"].values())
    row["best_fixed"] = best
    row["ratio"] = {arm: row[arm] / best for arm in ARMS}
    return row


def page(rows: list[dict], command: str, name: str) -> str:
    lines = [
        "# Start-up calibration under load, simulated",
        "",
        "`adaptive` in a replica that starts with N clients already running (Llama-3.1-8B + 1B draft, H100 profile, "
        "acceptance 0.7, 40 s), tokens/s over the best fixed k of the same case.",
        "",
        "| clients | drafts ahead | best fixed k, tok/s | cold | calibrated to batch 8 | calibrated to max_num_seqs |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        best_k = max(r["fixed"], key=r["fixed"].get)
        cells = " | ".join(f"{r['ratio'][a]:.3f}" for a in ARMS)
        lines.append(
            f"| {r['clients']} | {'yes' if r['drafts_ahead'] else 'no'} | {r['best_fixed']:,.0f} ({best_k}) | {cells} |"
        )
    lines += [
        "",
        f"Command: `{command}`",
        "",
        f"Raw data: [{name}.json]({name}.json). Plot: [{name}.png]({name}.png).",
        "",
    ]
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.25
    labels = [f"{r['clients']} clients\n{'ahead' if r['drafts_ahead'] else 'same step'}" for r in rows]
    for i, arm in enumerate(ARMS):
        ax.bar([x + (i - 1) * width for x in range(len(rows))], [r["ratio"][arm] for r in rows], width, label=arm)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)), labels)
    ax.set_ylim(0.7, 1.08)
    ax.set_ylabel("tokens/s over the best fixed k")
    ax.set_title("adaptive starting under load, simulated (H100, 8B + 1B)")
    ax.legend(loc="upper center", ncol=3, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="4,64,256")
    parser.add_argument("--out", default="bench/results/startup-calibration-sim")
    args = parser.parse_args()
    try:
        counts = [int(c) for c in args.clients.split(",")]
    except ValueError:
        parser.error(f"--clients: {args.clients!r} is not a comma-separated list of counts")
    rows = []
    for drafts_ahead in (True, False):
        for clients in counts:
            print(f"{clients} clients, drafts ahead: {drafts_ahead} ...", file=sys.stderr, flush=True)
            rows.append(run_case(clients, drafts_ahead))
    prefix = Path(args.out)
    command = "PYTHONPATH=$PWD .venv/bin/python lab/studies/startup_calibration/cold_clients.py " + " ".join(
        sys.argv[1:]
    )
    prefix.with_suffix(".json").write_text(json.dumps({"command": command.strip(), "rows": rows}, indent=2) + "\n")
    text = page(rows, command.strip(), prefix.name)
    prefix.with_suffix(".md").write_text(text)
    plot(rows, prefix.with_suffix(".png"))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

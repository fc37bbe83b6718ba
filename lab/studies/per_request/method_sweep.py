"""How far up the batch sizes each speculative method's speed-up lasts in the simulator (TurboSpec §6, Figure 12):
the three method-{draft,eagle,ngram}-h100-8b-batch scenarios, alike but for the proposer, each phase of their closed
loop (1 to 256 clients) read as tokens per second at ``fixed:k=3`` over the target alone (llama3.1-8b+ngram at
``fixed:k=0``: no proposer runs). Prints the table, writes ``--out``.{md,json,png}.

    PYTHONPATH=$PWD .venv/bin/python lab/studies/per_request/method_sweep.py [--out bench/results/method-sweep-sim-8b]
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specserve.sim import simulate, summarize  # noqa: E402

METHODS = {"draft model (Llama-3.2-1B)": "draft", "EAGLE head": "eagle", "n-gram lookup": "ngram"}
COMMAND = "PYTHONPATH=$PWD .venv/bin/python lab/studies/per_request/method_sweep.py"


def phase_rates(job: tuple[str, str]) -> list[dict]:
    scenario, policy = job
    return summarize(simulate(scenario, policy, 0))["phases"]  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench/results/method-sweep-sim-8b")
    args = parser.parse_args()
    jobs = [("method-ngram-h100-8b-batch", "fixed:k=0")]
    jobs += [(f"method-{m}-h100-8b-batch", "fixed:k=3") for m in METHODS.values()]
    with ProcessPoolExecutor(2) as pool:
        base, *runs = list(pool.map(phase_rates, jobs))
    clients = [p["clients"] for p in base]
    speedups = {
        name: [r["output_tokens_per_s"] / b["output_tokens_per_s"] for r, b in zip(run, base, strict=True)]
        for name, run in zip(METHODS, runs, strict=True)
    }
    lines = [
        "# Speed-up per method against batch size (simulator, H100, Llama-3.1-8B)",
        "",
        f"`{COMMAND}`: tokens per second at fixed:k=3 over the target alone at fixed:k=0, per closed-loop phase; "
        "acceptance 0.7 for every method.",
        "",
        "| clients | target alone, tok/s | " + " | ".join(METHODS) + " |",
        "|---|---|" + "---|" * len(METHODS),
    ]
    for i, c in enumerate(clients):
        cells = " | ".join(f"{speedups[name][i]:.2f}x" for name in METHODS)
        lines.append(f"| {c} | {base[i]['output_tokens_per_s']:.0f} | {cells} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.with_suffix(".md").write_text(text)
    record = {"command": COMMAND, "clients": clients, "baseline_tok_s": [b["output_tokens_per_s"] for b in base]}
    out.with_suffix(".json").write_text(json.dumps(record | {"speedup": speedups}, indent=2) + "\n")
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in speedups.items():
        ax.plot(clients, values, marker="o", label=name)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("clients (decode batch)")
    ax.set_ylabel("speed-up at k = 3 over the target alone")
    ax.set_title("Simulated H100, Llama-3.1-8B, acceptance 0.7")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)


if __name__ == "__main__":
    main()

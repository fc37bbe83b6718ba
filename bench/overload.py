"""Admitted requests' latency at twice the engine's capacity, without and with admission bounds.

    PYTHONPATH=$PWD .venv/bin/python bench/overload.py [--max-num-seqs 4] [--duration 40] \
        [--out bench/results/overload.json]

1. Capacity: `specserve serve` with Ray Serve LLM's default admission (none) under a closed loop of
   2 x max_num_seqs clients; completed requests per second.
2. Open loop (Poisson) at twice that rate for ``--duration`` s, still unbounded: every request is admitted and
   waits inside the engine, so latency grows with the queue for as long as the overload lasts.
3. The same load on a server started with ``max_ongoing_requests = max_queued_requests = max_num_seqs``: past
   the queue, Ray Serve refuses at once (503, Retry-After 1 s).

Prints and writes JSON (admitted requests' end-to-end latency, refused share) and plots each request's latency
against its send time for both (PNG beside the JSON). Both servers run on this machine one after the other, so
the comparison is of the shape (bounded or growing), not of a few percent.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from serve_overhead import stop_server, wait_for_endpoint

ROOT = Path(__file__).resolve().parent.parent


def serve(config: dict[str, Any], log_dir: Path, name: str) -> tuple[subprocess.Popen, str]:
    path = log_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    log = log_dir / f"{name}.log"
    cmd = [sys.executable, "-m", "specserve.cluster.cli", "serve", "--config", str(path), "--port", str(free_port())]
    cmd += ["--metrics-port", str(free_port())]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["SPECSERVE_STATE_DIR"] = str(log_dir / f"{name}-state")
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT, env=env)
    return proc, wait_for_endpoint(log, proc, None, timeout_s=600)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench(url: str, load: list[str], output_len: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "specserve.cluster.cli", "bench", "run", "--url", url, "--json", "--per-request"]
    cmd += ["--input-len", "32", "--output-len", str(output_len), "--no-progress", "--timeout", "600", *load]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def summary(report: dict[str, Any]) -> dict[str, Any]:
    rows = report["per_request"]
    admitted = sorted(r["e2e_ms"] for r in rows if r["error"] is None)
    refused = [r for r in rows if r["error"] is not None]

    def pct(q: float) -> float | None:
        return admitted[min(len(admitted) - 1, int(q * len(admitted)))] if admitted else None

    return {
        "sent": len(rows),
        "admitted": len(admitted),
        "refused": len(refused),
        "refused_share": len(refused) / len(rows) if rows else 0.0,
        "errors": sorted({r["error"] for r in refused}),
        "admitted_e2e_ms": {
            "p50": pct(0.50),
            "p90": pct(0.90),
            "p99": pct(0.99),
            "max": admitted[-1] if admitted else None,
        },
    }


def plot(runs: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (name, report), color in zip(runs.items(), ("tab:red", "tab:blue"), strict=True):
        rows = [r for r in report["per_request"] if r["error"] is None]
        ax.scatter([r["sent_s"] for r in rows], [r["e2e_ms"] / 1000 for r in rows], s=8, color=color, label=name)
    ax.set_xlabel("request sent at (s)")
    ax.set_ylabel("end-to-end latency of admitted requests (s)")
    ax.set_title("Open loop at 2x capacity")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--duration", type=float, default=40.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/overload.json")
    args = parser.parse_args()
    seqs = args.max_num_seqs
    base = {"engine_kwargs": {"max_num_seqs": seqs}, "speculation": {"policy": "adaptive"}}
    bounded = base | {
        "deployment_config": {"max_ongoing_requests": seqs, "max_queued_requests": seqs},
        "server": {"retry_after_s": 1.0},
    }
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="specserve-overload-") as tmp:
        proc, url = serve(base, Path(tmp), "unbounded")
        try:
            bench(url, ["--concurrency", str(seqs), "--num-requests", str(2 * seqs)], args.output_len)  # warm-up
            closed = bench(url, ["--concurrency", str(2 * seqs), "--duration", "30"], args.output_len)
            capacity = closed["throughput"]["requests_per_s"]
            rate = 2 * capacity
            print(f"capacity {capacity:.2f} req/s; open loop at {rate:.2f} req/s", file=sys.stderr, flush=True)
            load = ["--rate", f"{rate:.3f}", "--duration", str(args.duration), "--seed", "1"]
            runs["unbounded (Ray Serve LLM default)"] = bench(url, load, args.output_len)
        finally:
            stop_server(proc)
        proc, url = serve(bounded, Path(tmp), "bounded")
        try:
            bench(url, ["--concurrency", str(seqs), "--num-requests", str(2 * seqs)], args.output_len)
            runs[f"bounded (ongoing {seqs}, queued {seqs})"] = bench(url, load, args.output_len)
        finally:
            stop_server(proc)
    result = {
        "command": "PYTHONPATH=$PWD .venv/bin/python bench/overload.py " + " ".join(sys.argv[1:]),
        "max_num_seqs": seqs,
        "output_len": args.output_len,
        "capacity_requests_per_s": capacity,
        "offered_requests_per_s": rate,
        "duration_s": args.duration,
        "runs": {name: summary(report) for name, report in runs.items()},
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot(runs, args.out.with_suffix(".png"))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

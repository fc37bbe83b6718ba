"""Start-up time and memory of `specserve serve` on this machine, plus a short load.

    .venv/bin/python bench/serve_footprint.py [--requests 32] [--concurrency 4] [-- SERVE_ARGS...]

Prints one JSON document: seconds to the `endpoint:` line, peak RSS of the whole process tree (Ray,
Serve, EngineCore, workers) sampled every 0.2 s, request latency and tokens/s under the load, the
replica's final k and acceptance, and seconds to a clean exit after SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import requests


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TreeSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.root, self.peak_bytes, self.done = psutil.Process(pid), 0, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                tree = [self.root, *self.root.children(recursive=True)]
                self.peak_bytes = max(self.peak_bytes, sum(_rss(p) for p in tree))
            except psutil.NoSuchProcess:
                return
            self.done.wait(0.2)


def _rss(process: psutil.Process) -> int:
    try:
        return process.memory_info().rss
    except psutil.NoSuchProcess:
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("serve_args", nargs="*")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="specserve-bench-") as state_dir:
        return measure(args, dict(os.environ, SPECSERVE_STATE_DIR=state_dir))


def measure(args: argparse.Namespace, env: dict[str, str]) -> int:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "specserve",
        "serve",
        "--port",
        str(port),
        "--metrics-port",
        str(free_port()),
        *args.serve_args,
    ]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sampler = TreeSampler(proc.pid)
    sampler.start()
    for line in proc.stderr:
        if line.startswith("endpoint:"):
            break
    else:
        print(json.dumps({"error": f"serve exited with {proc.wait()}"}))
        return 1
    ready_s = time.monotonic() - started
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # keep the pipe drained

    url = f"http://127.0.0.1:{port}/v1/completions"
    body = {"model": "specserve-tiny", "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}

    def one(i: int) -> float:
        t = time.monotonic()
        requests.post(url, json=body | {"prompt": f"def function_{i}(x):\n"}, timeout=300).raise_for_status()
        return time.monotonic() - t

    load_started = time.monotonic()
    with ThreadPoolExecutor(args.concurrency) as pool:
        latencies = sorted(pool.map(one, range(args.requests)))
    load_s = time.monotonic() - load_started
    time.sleep(2.0)  # one more telemetry round
    status = subprocess.run(
        [sys.executable, "-m", "specserve", "status", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    replica = (json.loads(status.stdout)["replicas"] or [{}])[0] if status.returncode == 0 else {}
    stop_started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    exit_code = proc.wait(timeout=120)
    sampler.done.set()
    print(
        json.dumps(
            {
                "ready_s": round(ready_s, 1),
                "peak_rss_gib": round(sampler.peak_bytes / 2**30, 2),
                "requests": args.requests,
                "concurrency": args.concurrency,
                "p50_latency_s": round(latencies[len(latencies) // 2], 3),
                "max_latency_s": round(latencies[-1], 3),
                "output_tokens_per_s": round(args.requests * args.max_tokens / load_s, 1),
                "final_policy": replica.get("engine", {}).get("policy"),
                "final_k": replica.get("engine", {}).get("k"),
                "acceptance_position_0": replica.get("acceptance"),
                "shutdown_s": round(time.monotonic() - stop_started, 1),
                "exit_code": exit_code,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

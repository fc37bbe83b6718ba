"""A live serving stack for the dashboard tests: `specserve serve` on a copy of the tiny pair, a real Prometheus
scraping it, and a script of load and operator actions that makes every dashboard panel's metrics move.

The script, in order (about a minute and a half after the engine is up):
1. speculation at `fixed:k=2` (SPECULATING);
2. `policy set fixed:k=0` and load: Nightjar's offload trigger (k = 0 and free KV blocks below a share of the
   pool, set to 0.999 so that a few busy blocks of this large pool hold it) fires, the controller grants the
   offload and the pool grows; the draft's checkpoint has been moved away, so the reload the controller grants
   once the load is light fails, and the retries go on failing until Prometheus has recorded the offload;
3. the checkpoint back and `policy set fixed:k=2`: the retried reload succeeds and speculation resumes.

Speculation runs at a fixed k, not under `adaptive`, because whether `adaptive` speculates is the machine's call: on
an AVX2-only CPU its k = 0 steps at 4 requests measured 14 ms against 60 ms for k = 4 with 2.7 tokens per request,
so it rightly stopped, and at this script's 0.999 share Nightjar's trigger then offloaded the draft within a few
steps, again after every reload. The dashboards need speculation they can count on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import requests
from serve_process import ServeProcess, free_port

from specserve import metrics_catalog as catalog
from specserve.cluster import alert_rules
from specserve.cluster.prometheus import PrometheusServer
from specserve.models.prompts import OPENINGS

MODEL = "specserve-tiny"
SPECULATING = "fixed:k=2"
DRAFT_STATE = catalog.DRAFT_STATE.exported


@dataclass
class LiveStack:
    server: ServeProcess
    prometheus: PrometheusServer
    pair_dir: Path
    # monotonic, for the script's log; wall clock, for Prometheus' query window.
    started_s: float
    started_wall_s: float
    # What the script saw, from `specserve status --json`, for the tests' messages.
    log: list[str] = field(default_factory=list)

    @property
    def prometheus_url(self) -> str:
        return self.prometheus.url

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "specserve.cluster.cli", *args],
            env=self.server.env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def engine(self) -> dict:
        done = self.cli("status", "--json")
        replicas = json.loads(done.stdout)["replicas"] if done.returncode == 0 else []
        return replicas[0]["engine"] | {"replica_id": replicas[0]["replica_id"]} if replicas else {}

    def wait_engine(self, what: str, until, timeout_s: float = 90.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (engine := self.engine()) and until(engine):
                self.log.append(f"{time.monotonic() - self.started_s:.0f} s: {what}")
                return engine
            time.sleep(0.5)
        raise TimeoutError(f"not seen within {timeout_s} s: {what}; so far: {self.log}\n{self.server.tail()}")

    def set_policy(self, spec: str) -> None:
        done = self.cli("policy", "set", spec)
        assert done.returncode == 0, done.stderr
        self.wait_engine(f"policy {spec}", lambda e: e["policy"] == spec)


class Load:
    """``clients`` closed-loop clients sending completions until stopped."""

    def __init__(self, endpoint: str, clients: int, max_tokens: int) -> None:
        self.endpoint, self.clients, self.max_tokens = endpoint, clients, max_tokens
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(clients)
        self._clients: list[Future] = []
        self.num_done = 0

    def __enter__(self) -> Load:
        self._clients = [self._pool.submit(self._client, index) for index in range(self.clients)]
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._pool.shutdown(wait=True)
        for client in self._clients:
            client.result()  # a failed request fails the script here

    def _client(self, index: int) -> None:
        while not self._stop.is_set():
            prompt = OPENINGS[(index + self.num_done) % len(OPENINGS)]
            body = {"model": MODEL, "prompt": prompt, "max_tokens": self.max_tokens, "temperature": 0}
            requests.post(self.endpoint + "/completions", json=body, timeout=120).raise_for_status()
            self.num_done += 1


def start(tmp: Path, trained_pair) -> LiveStack:
    pair_dir = tmp / "pair"
    shutil.copytree(trained_pair.target, pair_dir / "target")
    shutil.copytree(trained_pair.draft, pair_dir / "draft")
    config = tmp / "serve.yaml"
    config.write_text(
        f"model_loading_config:\n  model_id: {MODEL}\n  model_source: {pair_dir / 'target'}\n"
        f"speculation:\n  draft: {pair_dir / 'draft'}\n  policy: {SPECULATING}\n"
        "  draft_offload: true\n  offload_low_free_ratio: 0.999\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["SPECSERVE_STATE_DIR"] = str(tmp / "state")
    args = ["--port", str(free_port()), "--metrics-port", str(free_port()), "--max-k", "4", "--config", str(config)]
    server = ServeProcess(args, env, tmp / "serve.log")
    try:
        server.endpoint = server.start()
        metrics_host = server.line_matching(r"metrics: ").split()[1].split("/")[2]
        prometheus = PrometheusServer(
            tmp / "prometheus", free_port(), [metrics_host], rules=alert_rules.rules_document()
        )
        prometheus.start()
    except BaseException:
        server.kill_tree()
        raise
    return LiveStack(server, prometheus, pair_dir, time.monotonic(), time.time())


def phase(stack: LiveStack, what: str, until, clients: int, max_tokens: int, hold_s: float) -> None:
    """Load until the engine shows ``until``, then ``hold_s`` more (longer phases draw clearer pictures)."""
    with Load(stack.server.endpoint, clients, max_tokens):
        stack.wait_engine(what, until)
        time.sleep(hold_s)


def drive(stack: LiveStack, hold_s: float = 0.0) -> None:
    """The script of the module docstring."""
    draft, hidden = stack.pair_dir / "draft", stack.pair_dir / "hidden"
    phase(stack, "speculation", lambda e: sum(e["num_steps_by_k"][1:]) >= 200, 4, 48, hold_s)
    shutil.move(draft, hidden)
    try:
        stack.set_policy("fixed:k=0")
        phase(stack, "draft offloaded", lambda e: e["num_offloads"] >= 1, 8, 160, hold_s)
        phase(stack, "reload failed", lambda e: e["num_reload_failures"] >= 1, 1, 32, hold_s)
        # Ray exports a gauge's last value every ~10 s, so an offloaded spell shorter than that (a reload is
        # granted within a few steps of calm) can fall between two exports. With the checkpoint still away the
        # retries fail, backing off 5, 10, 20 s, so the draft stays offloaded until an export records it.
        with Load(stack.server.endpoint, 1, 32):
            stack.prometheus.wait_for(f'{DRAFT_STATE}{{{catalog.STATE}="offloaded"}} == 1', timeout_s=90)
            stack.log.append(f"{time.monotonic() - stack.started_s:.0f} s: offloaded exported")
    finally:
        shutil.move(hidden, draft)
    stack.set_policy(SPECULATING)
    phase(stack, "draft reloaded", lambda e: e["num_reloads"] >= 1, 2, 48, hold_s)
    # Speculation again, over more than one of Ray's export rounds (about 10 s).
    phase(stack, "speculating again", lambda e: e["k"] > 0, 4, 48, max(hold_s, 15.0))
    stack.log.append(f"{time.monotonic() - stack.started_s:.0f} s: done")


def stop(stack: LiveStack) -> None:
    stack.prometheus.stop()
    if stack.server.proc is not None and stack.server.proc.poll() is None:
        stack.server.stop()
    stack.server.kill_tree()


def main() -> int:
    """Run the script with longer phases and draw every panel: the pictures in docs/dashboards/."""
    import argparse
    import tempfile

    from dashboards.render import render_all
    from specserve.models import cached_pair

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNGs")
    parser.add_argument("--hold-s", type=float, default=30.0, help="seconds each phase goes on once it has shown")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="specserve-dashboards-") as tmp:
        stack = start(Path(tmp), cached_pair("trained"))
        try:
            drive(stack, args.hold_s)
            time.sleep(15)  # Ray's last export round, then a scrape
            window = (stack.started_wall_s, time.time())
            for panel in render_all(stack.prometheus_url, args.out, window, rate_interval="30s"):
                print(f"{panel.path}  ({panel.num_series} series)")
        finally:
            stop(stack)
            print("\n".join(stack.log), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

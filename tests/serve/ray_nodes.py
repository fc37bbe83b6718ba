"""Real Ray nodes on this machine, each a `ray start --block` in a session of its own: a head, and workers that
join it. Stopping one (SIGTERM) drains it as an operator's `ray stop` would; killing one (SIGKILL to every
process of its tree) is a node failing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
from serve_process import TrackedProcess, free_port

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
# Each node's object store is shared memory; Ray's default (30 % of RAM per node) would let three nodes on this
# machine claim most of it.
OBJECT_STORE_BYTES = 256 * 1024**2


def ray_env(tmp_path) -> dict[str, str]:
    # Token auth would need the same token file on every client; these tests are about placement.
    env = dict(os.environ, RAY_AUTH_MODE="disabled", SPECSERVE_STATE_DIR=str(tmp_path / "state"))
    env.pop("RAY_ADDRESS", None)
    return env


class RayNode(TrackedProcess):
    """One Ray node. ``node_manager_port`` tells the nodes of one machine apart in ``ray.nodes()``."""

    address: str
    node_manager_port: int

    @classmethod
    def head(cls, env: dict[str, str], log_path, num_cpus: int) -> RayNode:
        node = cls(env, log_path)
        port = free_port()
        node._start(["--head", f"--port={port}", "--include-dashboard=false"], num_cpus, {})
        node.address = f"127.0.0.1:{port}"
        return node

    @classmethod
    def worker(cls, head: RayNode, log_path, num_cpus: int, resources: dict[str, float]) -> RayNode:
        node = cls(head.env, log_path)
        node._start([f"--address={head.address}"], num_cpus, resources)
        node.address = head.address
        return node

    def _start(self, args: list[str], num_cpus: int, resources: dict[str, float]) -> None:
        self.node_manager_port = free_port()
        self.launch(
            [
                RAY,
                "start",
                *args,
                f"--num-cpus={num_cpus}",
                f"--resources={json.dumps(resources)}",
                f"--node-manager-port={self.node_manager_port}",
                f"--object-store-memory={OBJECT_STORE_BYTES}",
                "--block",
            ]
        )
        self.wait_for_line(r".*This command will now block", timeout_s=120)

    def fail(self) -> None:
        """The node dies at once: SIGKILL to `ray start` and every process under it, engines included."""
        tree = [psutil.Process(self.proc.pid), *self.descendants()]
        for process in tree:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        self.proc.wait(timeout=30)
        assert not self.wait_gone(tree, timeout_s=30)

    def shut_down(self) -> list[str]:
        """Stop as `ray stop` would; returns the names of the processes still running afterwards (then killed),
        for the caller to report."""
        tree = self.descendants()
        if self.proc.poll() is None:
            self.stop(timeout_s=90)  # a node drains for up to 30 s before stopping its processes
        leftover = self.wait_gone(tree, timeout_s=60)
        names = []
        self.kill_tree()
        for process in leftover:
            try:
                names.append(process.name())
                process.kill()
            except psutil.NoSuchProcess:
                pass
        return names


def node_ids_by_port(address: str, env: dict[str, str]) -> dict[int, str]:
    """Live nodes' ids by node-manager port, from ``ray.nodes()`` in a client of the cluster."""
    script = (
        "import json, ray; ray.init(logging_level='ERROR'); "
        "print(json.dumps({n['NodeManagerPort']: n['NodeID'] for n in ray.nodes() if n['Alive']}))"
    )
    env = dict(env, RAY_ADDRESS=address)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return {int(port): node for port, node in json.loads(done.stdout.strip().splitlines()[-1]).items()}

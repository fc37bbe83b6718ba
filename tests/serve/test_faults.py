"""Serve tier: faults injected into the real stack under load. A replica's engine process is killed, then the
cluster controller actor is killed, then it hangs. One `specserve serve --replicas 1` for the module; the tests
run in order and print the recovery times they measure (docs/user-guide/reliability.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest
import requests
from closed_loop import Load
from serve_process import free_port, serving

from specserve import metrics_catalog as catalog

# Serve LLM checks an engine's health every 10 s; a new replica then loads its engine (tens of seconds on CPU).
REPLACEMENT_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def server(tmp_path_factory, trained_pair):
    folder = tmp_path_factory.mktemp("faults")
    # Through the node's agent (controller_batching: node): the faults below must leave that path as they leave
    # a replica's direct pushes, which every other served test runs.
    config = folder / "batching.yaml"
    config.write_text("speculation:\n  controller_batching: node\n")
    args = ["--port", str(free_port()), "--metrics-port", str(free_port()), "--replicas", "1", "--max-k", "4"]
    with serving([*args, "--config", str(config)], folder) as process:
        yield process


def cli(server, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specserve", *args], env=server.env, capture_output=True, text=True, timeout=120
    )


def status(server) -> list[dict]:
    """The replicas as `status --json` lists them; none while the controller is away."""
    done = cli(server, "status", "--json")
    return json.loads(done.stdout)["replicas"] if done.returncode == 0 else []


def wait_replicas(server, until, timeout_s: float) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if until(replicas := status(server)):
            return replicas
        time.sleep(0.5)
    raise TimeoutError(f"replicas not as expected within {timeout_s} s: {replicas}\n{server.tail()}")


def processes(server, title: str) -> list[psutil.Process]:
    """Serve's descendants whose process title starts with ``title`` (Ray and vLLM set them)."""
    found = []
    for process in server.descendants():
        try:
            if " ".join(process.cmdline()).startswith(title):
                found.append(process)
        except psutil.NoSuchProcess:
            continue
    return found


def test_a_killed_engine_fails_its_requests_and_serve_replaces_the_replica(server):
    (old,) = wait_replicas(server, lambda rs: len(rs) == 1, timeout_s=60)
    (engine,) = processes(server, "VLLM::EngineCore")
    with Load(server.endpoint, clients=2) as load:
        load.wait_answered(4)
        killed_at = load.now()
        engine.kill()  # SIGKILL, by the PID found above
        # A new replica answers requests sent after the kill once Serve has replaced the old one.
        first = load.wait_answered(1, after_s=killed_at, timeout_s=REPLACEMENT_TIMEOUT_S)
        (new,) = wait_replicas(
            server, lambda rs: len(rs) == 1 and rs[0]["replica_id"] != old["replica_id"], timeout_s=60
        )
        listed_at = load.now()
        load.wait_answered(5, after_s=listed_at)
    in_flight = [o for o in load.outcomes if o.start_s < killed_at < o.end_s]
    meanwhile = [o for o in load.outcomes if killed_at < o.start_s < first.start_s]
    error = next((o.detail for o in in_flight if not o.ok), "")
    print(
        f"\nengine killed: in-flight requests ended {[round(o.end_s - killed_at, 1) for o in in_flight]} s after, "
        f"with {sorted({o.status or o.detail for o in in_flight}, key=str)} ({error[:120]}); "
        f"{len(meanwhile)} requests sent before the replacement answered ended "
        f"{sorted({o.status or o.detail for o in meanwhile}, key=str)} after at most "
        f"{max((o.end_s - o.start_s for o in meanwhile), default=0):.1f} s; the first request sent after the kill "
        f"was answered {first.end_s - killed_at:.1f} s after it; status listed the new replica "
        f"{listed_at - killed_at:.1f} s after it"
    )
    assert in_flight, "the kill hit no request"
    # Every request ends, with an answer or an error, and none waits for its client's timeout.
    assert not [o for o in load.outcomes if o.timed_out], [o.detail for o in load.outcomes if o.timed_out]
    assert not all(o.ok for o in in_flight), "no request in flight on the killed engine failed"
    # The error says what happened, as vLLM's own server does (503), in OpenAI's error object, and no more.
    failed = [o for o in in_flight + meanwhile if not o.ok]
    assert all(o.status == 503 and json.loads(o.detail)["error"]["code"] == "engine_unavailable" for o in failed), [
        (o.status, o.detail[-500:]) for o in failed
    ]
    assert not any("Traceback" in o.detail for o in load.outcomes)
    assert new["replica_id"] != old["replica_id"]
    after = [o for o in load.outcomes if o.start_s > listed_at]
    assert after and all(o.ok for o in after), [o.detail for o in after if not o.ok]
    assert len(processes(server, "VLLM::EngineCore")) == 1


def test_a_killed_controller_comes_back_with_the_cluster_policy_and_serving_never_stops(server):
    (replica,) = wait_replicas(server, lambda rs: len(rs) == 1, timeout_s=60)
    rid = replica["replica_id"]
    assert cli(server, "policy", "set", "fixed:k=2").returncode == 0
    wait_replicas(server, lambda rs: [r["engine"]["policy"] for r in rs] == ["fixed:k=2"], timeout_s=30)
    # A per-replica choice is the replica's own, not the cluster's: a restarted controller hands the replica the
    # cluster policy again when it re-registers, which shows that the cluster policy outlived the actor.
    assert cli(server, "policy", "set", "--replica", rid, "fixed:k=1").returncode == 0
    wait_replicas(server, lambda rs: [r["engine"]["policy"] for r in rs] == ["fixed:k=1"], timeout_s=30)
    (controller,) = processes(server, "ray::ClusterController")
    assert processes(server, "ray::NodeAgent"), "the replica pushes through its node's agent"
    with Load(server.endpoint, clients=2) as load:
        load.wait_answered(4)
        killed_at = load.now()
        controller.kill()  # SIGKILL, by the PID found above
        back = wait_replicas(server, lambda rs: [r["replica_id"] for r in rs] == [rid], timeout_s=60)
        listed_at = load.now()
        wait_replicas(server, lambda rs: [r["engine"]["policy"] for r in rs] == ["fixed:k=2"], timeout_s=30)
        policy_at = load.now()
        load.wait_answered(4, after_s=policy_at)
    (restarted,) = processes(server, "ray::ClusterController")
    print(
        f"\ncontroller killed: status listed the replica again {listed_at - killed_at:.1f} s after, running the "
        f"cluster policy {policy_at - killed_at:.1f} s after"
    )
    assert restarted.pid != controller.pid and back
    # The replica served on its own while the controller was gone: every request was answered.
    assert all(o.ok for o in load.outcomes), [o.detail for o in load.outcomes if not o.ok]
    assert [o for o in load.outcomes if o.start_s < listed_at and o.end_s > killed_at], "no request during the outage"


def controller_connected(server, replica_id: str) -> float | None:
    """The replica's ``controller_connected`` gauge as Ray's metrics port exports it (None before its first export)."""
    url = server.line_matching(r"metrics: ").split()[1]
    text = requests.get(url, timeout=10).text
    name = catalog.CONTROLLER_CONNECTED.exported
    for line in text.splitlines():
        if line.startswith(name + "{") and f'{catalog.REPLICA}="{replica_id}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_connected(server, replica_id: str, value: float, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (seen := controller_connected(server, replica_id)) != value:
        assert time.monotonic() < deadline, f"controller_connected {seen}, not {value}, after {timeout_s} s"
        time.sleep(1.0)


def test_a_hung_controller_hands_the_replica_to_local_rules_and_serving_never_waits(server):
    # A controller that hangs is not restarted by Ray as a crashed one is: the replica's pushes time out instead.
    (replica,) = wait_replicas(server, lambda rs: len(rs) == 1, timeout_s=60)
    rid = replica["replica_id"]
    wait_connected(server, rid, 1.0, timeout_s=60)
    (controller,) = processes(server, "ray::ClusterController")
    assert processes(server, "ray::NodeAgent"), "the replica pushes through its node's agent"
    with Load(server.endpoint, clients=2) as load:
        load.wait_answered(2)
        hung_at = load.now()
        controller.suspend()  # SIGSTOP, by the PID found above
        try:
            wait_connected(server, rid, 0.0, timeout_s=60)
            local_at = load.now()
            load.wait_answered(4, after_s=local_at)
        finally:
            controller.resume()
        resumed_at = load.now()
        wait_connected(server, rid, 1.0, timeout_s=60)
        back_at = load.now()
        load.wait_answered(2, after_s=back_at)
    print(
        f"\ncontroller hung: the replica exported local rules {local_at - hung_at:.1f} s after, coordination "
        f"again {back_at - resumed_at:.1f} s after it resumed (both as Ray's ~10 s metrics export shows them)"
    )
    assert all(o.ok for o in load.outcomes), [o.detail for o in load.outcomes if not o.ok]
    assert wait_replicas(server, lambda rs: [r["replica_id"] for r in rs] == [rid], timeout_s=30)

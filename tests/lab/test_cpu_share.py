"""The benchmarks' CPU tally: a process tree's CPU seconds over a load, by role."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest
from titled_processes import SLEEP, THREAD_ON_DEMAND, stop, titled

from lab.instruments.cpu_share import CpuTally, cores_by_role, pin_engine, role_of

# About a second of one core's work, whatever else the machine runs.
BURN = "sum(i * i for i in range(15_000_000))"


def burn(*labels: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", BURN, *labels])


def test_a_childs_cpu_time_counts_under_the_role_its_command_line_names():
    tally = CpuTally(os.getpid(), root_role="test process")
    tally.start()
    child = burn("ProxyActor")
    try:
        # Read while it runs: a child that has ended and been reaped is no longer in the tree. The last read may
        # find it ended but not yet reaped, with no command line left: it keeps the role it was seen with.
        while child.poll() is None:
            roles = tally.stop()
            time.sleep(0.05)
    finally:
        child.wait()
    assert roles.get("HTTP proxy", 0.0) > 0.0
    assert set(roles) <= {"HTTP proxy", "test process"}


def test_a_child_that_ended_unreaped_keeps_the_role_it_was_seen_with():
    tally = CpuTally(os.getpid(), root_role="test process")
    tally.start()
    child = subprocess.Popen([sys.executable, "-c", f"import time; {BURN}; time.sleep(0.5)", "ProxyActor"])
    try:
        process = psutil.Process(child.pid)
        while "ProxyActor" not in " ".join(process.cmdline()):
            time.sleep(0.01)
        tally.stop()  # seen running, under its role
        # Not reaped: ``Popen.poll`` would reap it, so watch its state instead.
        while process.status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.05)
        roles = tally.stop()
    finally:
        child.wait()
    assert roles.get("HTTP proxy", 0.0) > 0.0
    assert "other" not in roles


class Exiting:
    """A process part-way through exit: its command line is already empty, its name is still there."""

    pid = 1

    def cmdline(self) -> list[str]:
        return []

    def name(self) -> str:
        return "python3"


def test_a_process_with_no_command_line_left_is_gone_not_other():
    assert role_of(Exiting()) == "gone"


def test_the_report_divides_by_the_output_tokens_and_the_wall_time():
    tally = CpuTally(os.getpid())
    tally.roles, tally.wall_s = {"engine": 3.0, "HTTP proxy": 1.0}, 2.0
    report = tally.report(output_tokens=1000)
    assert report["cores_busy"] == 2.0
    assert report["engine_share_of_cpu"] == 0.75
    assert report["cpu_ms_per_output_token"] == {"engine": 3.0, "HTTP proxy": 1.0}
    assert tally.report(output_tokens=0)["cpu_ms_per_output_token"] == {}


@pytest.mark.parametrize("pid", [2**22 + 12345])
def test_a_tree_that_is_gone_tallies_nothing(pid):
    tally = CpuTally(pid)
    tally.start()
    assert tally.stop() == {}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to split")
def test_pinning_puts_the_engines_threads_on_its_cores_the_rest_elsewhere_and_later_threads_follow():
    engine_core, other_core = sorted(os.sched_getaffinity(0))[:2]
    engine = titled("VLLM::EngineCore", THREAD_ON_DEMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proxy = titled("ray::ProxyActor")
    try:
        pin_engine(engine.pid, {engine_core}, {other_core}, extra=(proxy.pid,))
        held = cores_by_role(engine.pid, extra=(proxy.pid,))
        engine.stdin.write("a thread started after the pinning\n")
        engine.stdin.flush()
        later = engine.stdout.readline().strip()
    finally:
        stop(engine, proxy)
    assert held == {"engine": [engine_core], "HTTP proxy": [other_core]}
    assert later == str([engine_core])


def test_only_a_title_names_an_engine_not_an_argument_that_mentions_a_worker():
    # The raylet's command line carries Ray's Java worker command (io.ray.runtime.runner.worker.DefaultWorker).
    raylet = subprocess.Popen(
        [sys.executable, "-c", SLEEP, "raylet", "--java_worker_command=io.ray.runtime.runner.worker.DefaultWorker"]
    )
    worker = titled("VLLM::Worker_TP0")
    try:
        roles = role_of(psutil.Process(raylet.pid)), role_of(psutil.Process(worker.pid))
    finally:
        stop(raylet, worker)
    assert roles == ("Ray: raylet", "engine")

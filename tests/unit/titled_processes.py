"""Child processes titled as vLLM and Ray title theirs (``VLLM::EngineCore``, ``ray::ProxyActor``), for the tests of
what the benchmarks and the replicas find by title."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

# Starts a thread for each line it reads and prints the cores that thread may run on.
THREAD_ON_DEMAND = """
import os, sys, threading
for line in sys.stdin:
    thread = threading.Thread(target=lambda: print(sorted(os.sched_getaffinity(0)), flush=True))
    thread.start()
    thread.join()
"""
SLEEP = "import time; time.sleep(60)"


def titled(title: str, code: str = SLEEP, *args: str, **popen: object) -> subprocess.Popen:
    """``code`` in a child process that first sets its title to ``title``; returns once the title shows."""
    child = subprocess.Popen(
        [sys.executable, "-c", f"import setproctitle; setproctitle.setproctitle({title!r})\n{code}", *args],
        **popen,  # type: ignore[call-overload]
    )
    process = psutil.Process(child.pid)
    while not process.cmdline() or not process.cmdline()[0].startswith(title):
        time.sleep(0.02)
    return child


def stop(*children: subprocess.Popen) -> None:
    for child in children:
        child.kill()
        child.wait()

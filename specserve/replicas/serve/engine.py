"""Ray Serve LLM's vLLM engine with the executor a CPU replica should run.

Ray Serve LLM starts every CPU engine with vLLM's multiprocess executor (``distributed_executor_backend="mp"``),
even at one rank. The worker then runs in a process of its own, and the EngineCore process waits for each step's
result by spinning on a shared-memory queue (``vllm/distributed/device_communicators/shm_broadcast.py``:
``SpinCondition`` busy-loops with ``sched_yield`` for a second after every read). On a small CPU machine that
spin takes most of a core from the worker's OpenMP threads: on the 2-core development machine the EngineCore
sat at ~80 % of a core while it served. At one rank the uniprocess executor runs the worker inside the
EngineCore process, as vLLM's own ``vllm serve`` does, and nothing spins. ``ServeConfig.cpu_executor`` picks
(``uni`` by default, ``mp`` for Ray's choice); GPU engines and tensor-parallel CPU engines keep Ray's.

Private interfaces used (Ray 2.60): ``VLLMEngine._prepare_engine_config`` (overridden, its result adjusted) and
``LLMServer._default_engine_cls``; ``LLMConfig.experimental_configs`` carries the choice.
"""

from __future__ import annotations

from typing import Any

from ray.llm._internal.serve.engines.vllm.vllm_engine import VLLMEngine

from specserve.replicas.config.engine_args import CPU_EXECUTOR_KEY


class SpecVLLMEngine(VLLMEngine):
    def _prepare_engine_config(self, callback_ctx: Any) -> Any:
        engine_args, frontend_args, vllm_config = super()._prepare_engine_config(callback_ctx)
        wanted = self.llm_config.experimental_configs.get(CPU_EXECUTOR_KEY, "mp")
        parallel = vllm_config.parallel_config
        if vllm_config.device_config.device_type == "cpu" and parallel.world_size == 1 and wanted == "uni":
            parallel.distributed_executor_backend = "uni"
            engine_args.distributed_executor_backend = "uni"
        return engine_args, frontend_args, vllm_config

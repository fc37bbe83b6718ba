"""The Ray Serve replica: Ray Serve LLM's ``LLMServer`` plus specserve's telemetry loop.

Used as ``LLMConfig(server_cls=SpecLLMServer)``, so the OpenAI routes, request validation and
streaming all come from Ray Serve LLM and vLLM. What this adds runs beside the requests on the
replica's event loop: about once a second it reads the engine's telemetry (an EngineCore utility
call, a few ms), updates the metrics, pushes a snapshot to the cluster controller and applies the
directives it gets back (controller_push.py: a slow controller never holds up a round). Nothing in it waits on a
request, and no request waits on it.

Private interfaces used (Ray 2.60 / vLLM 0.32): ``LLMServer.engine._engine_client`` (the AsyncLLM)
and its ``engine_core.call_utility_async``; ``LLMServer._default_engine_cls`` (engine.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, assert_never

import ray
from ray import serve
from ray.serve.llm.deployment import LLMServer

from specserve.cpu_list import parse_cpu_list
from specserve.messages import (
    AcceptancePrior,
    BatchingDirective,
    Directive,
    EngineTelemetry,
    MemoryDirective,
    PolicyDirective,
    ReplicaSnapshot,
)
from specserve.replicas.config.cpu_affinity import pin_engine_processes
from specserve.replicas.config.engine_args import (
    CONTROLLER_KEY,
    ENGINE_CPUS_KEY,
    STARTUP_CHECKS_KEY,
    Utility,
)
from specserve.replicas.serve.calibration import AsyncLLMEngine, calibrate_engine
from specserve.replicas.serve.controller_link import ControllerLink
from specserve.replicas.serve.controller_push import ControllerPusher, find_controller
from specserve.replicas.serve.engine import SpecVLLMEngine
from specserve.replicas.serve.metrics import ReplicaMetrics

logger = logging.getLogger("ray.serve")

TELEMETRY_INTERVAL_S = 1.0
# A round waits this long for the controller's answer, then goes on (the push stays out; see controller_push.py).
PUSH_WAIT_S = 0.8
# How long a replica shutting down waits to say goodbye to the controller.
CONTROLLER_TIMEOUT_S = 2.0


class SpecLLMServer(LLMServer):
    # The engine class LLMServer starts (engine.py: the executor a CPU replica runs).
    _default_engine_cls = SpecVLLMEngine

    # Ray Serve awaits an async __init__ (LLMServer's own is async); Python's type rules say __init__ returns
    # None, so the checker is told this one is deliberate.
    async def __init__(self, llm_config: Any, **kwargs: Any) -> None:  # type: ignore[misc]
        self._telemetry_task: asyncio.Task | None = None
        await super().__init__(llm_config, **kwargs)

    async def start(self) -> None:
        await super().start()
        self._pin_engine()
        # Before the replica reports ready: Serve routes no request to it until start returns.
        await self._calibrate()
        context = serve.get_replica_context()
        self._replica_id = context.replica_id.unique_id
        self._node_id = ray.get_runtime_context().get_node_id()
        self._model_id = self._llm_config.model_id
        self._metrics = ReplicaMetrics(model=self._model_id, replica=self._replica_id)
        self._join_controller()
        # Built here, so that a bad `controller_batching` fails the replica's start, naming it.
        batching = (self._llm_config.experimental_configs.get(CONTROLLER_KEY) or {}).get("batching", "auto")
        pusher = ControllerPusher(self._node_id, batching, self._apply)
        self._telemetry_task = asyncio.get_running_loop().create_task(self._telemetry_loop(pusher))

    async def _calibrate(self) -> None:
        """The start-up checks and step timings (calibration.py), unless the config turns them off."""
        mode = self._llm_config.experimental_configs.get(STARTUP_CHECKS_KEY, "fallback")
        if mode == "off":
            return
        client = self.engine._engine_client
        result = await calibrate_engine(
            AsyncLLMEngine(client),
            self._llm_config.engine_kwargs,
            client.vllm_config.scheduler_config.max_num_seqs,
            on_failure=mode,
        )
        logger.info(
            "specserve: start-up checks %s in %.1f s; serving under %s",
            "passed" if not result.failed else f"failed: {', '.join(result.failed)}",
            result.seconds,
            result.policy,
        )

    def _join_controller(self) -> None:
        """Start the cluster's controller where no one has (a deployment built with Ray Serve LLM's own builder or
        ``serve run`` of a rendered config), so that `specserve status`, `policy set` and the alerts work however the
        replicas were deployed. Named, detached and created at most once: a running controller is joined as it is.
        Only here, at start: a controller that later dies is looked up again, never recreated by a replica."""
        from specserve.controller.actor import get_or_create_controller
        from specserve.memory import ClusterMemoryParams

        wanted = self._llm_config.experimental_configs.get(CONTROLLER_KEY) or {}
        try:
            get_or_create_controller(
                ClusterMemoryParams(
                    max_concurrent_transfers=wanted.get("max_concurrent_reloads"),
                    min_resident_per_deployment=wanted.get("min_resident_drafts", 0),
                )
            )
        except Exception:  # serving goes on with local rules; the telemetry loop keeps looking for one
            logger.exception("specserve: could not start or join the cluster's controller")

    def _pin_engine(self) -> None:
        """``engine_cpus``: every thread of this replica's engine processes onto those cores, once they run (the
        threads they start later inherit them). A core this node lacks fails the replica's start, naming it."""
        cores = self._llm_config.experimental_configs.get(ENGINE_CPUS_KEY)
        if cores is None:
            return
        try:
            pids = pin_engine_processes(parse_cpu_list(cores))
        except OSError as e:
            raise RuntimeError(f"engine_cpus {cores!r}: this node cannot run the engine there ({e})") from e
        if pids:
            logger.info("specserve: engine processes %s on cores %s", pids, cores)
        else:
            logger.warning("specserve: engine_cpus %r: no engine process under this replica to move", cores)

    # -- methods callable through a DeploymentHandle ---------------------------------------------

    async def specserve_set_policy(self, spec: str) -> str:
        """Switch this replica's policy from its next engine step; returns the canonical spec."""
        return await self._engine_core().call_utility_async(Utility.SET_POLICY, spec)

    # -- the telemetry loop ------------------------------------------------------------------------

    async def _telemetry_loop(self, pusher: ControllerPusher) -> None:
        link = ControllerLink()
        try:
            while True:
                started = time.monotonic()
                try:
                    snapshot = await self._read_snapshot(since_step=self._metrics.num_steps_seen)
                    self._metrics.update(snapshot.engine)
                    answered = await pusher.round(snapshot, deadline_s=started + PUSH_WAIT_S)
                    # The controller grants draft transfers while it answers; without it the engine grants its own.
                    coordinated = link.round(answered=answered)
                    self._metrics.controller_connected(coordinated)
                    memory = snapshot.engine.draft_memory
                    if memory is not None and memory.draft_bytes and coordinated != memory.coordinated:
                        await self._engine_core().call_utility_async(Utility.MEMORY_COORDINATED, coordinated)
                except asyncio.CancelledError:
                    raise
                except Exception:  # keep serving: telemetry must never take the replica down
                    logger.exception("specserve: telemetry round failed")
                await asyncio.sleep(pusher.next_round_s(TELEMETRY_INTERVAL_S, started))
        finally:
            pusher.cancel()

    async def _apply(self, directive: Directive) -> None:
        match directive:
            case PolicyDirective(policy=policy):
                spec = await self.specserve_set_policy(policy)
                logger.info("specserve: controller set policy %s", spec)
            case AcceptancePrior(accepted_per_pos=accepted, reached_per_pos=reached, num_replicas=peers):
                await self._engine_core().call_utility_async(Utility.SEED_ACCEPTANCE, list(accepted), list(reached))
                logger.info("specserve: acceptance prior from %d replica(s)", peers)
            case MemoryDirective(kind=decision, reason=reason):
                await self._engine_core().call_utility_async(Utility.MEMORY_DIRECTIVE, decision.value)
                logger.info("specserve: controller %s (%s)", decision.value, reason)
            case BatchingDirective():  # the pusher's own (controller_push.py): it never passes one on
                pass
            case _:  # a new kind of Directive fails the type check here until the replica handles it
                assert_never(directive)

    async def _read_snapshot(self, since_step: int) -> ReplicaSnapshot:
        data = await self._engine_core().call_utility_async(Utility.TELEMETRY, since_step)
        return ReplicaSnapshot(
            replica_id=self._replica_id,
            node_id=self._node_id,
            model_id=self._model_id,
            engine=EngineTelemetry.from_dict(data),
        )

    def _engine_core(self) -> Any:
        return self.engine._engine_client.engine_core

    async def __del__(self) -> None:
        if self._telemetry_task is not None:
            self._telemetry_task.cancel()
            controller = find_controller()
            if controller is not None:
                try:
                    await asyncio.wait_for(controller.unregister.remote(self._replica_id), CONTROLLER_TIMEOUT_S)
                except (TimeoutError, ray.exceptions.RayActorError):
                    pass  # it ages out of the controller's view instead
        await super().__del__()

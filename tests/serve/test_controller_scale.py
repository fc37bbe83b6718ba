"""The controller's path at scale on a real local Ray: the node agent that batches a node's pushes, a replica's
pusher that a hung controller cannot hold up, and the scale benchmark's own run."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import replace

import pytest
import ray

from specserve.cluster.controller_bench import run_point, virtual_snapshot
from specserve.controller.actor import get_or_create_controller
from specserve.controller.node_agent import get_or_create_node_agent
from specserve.controller.state import AUTO_BATCH_FROM_REPLICAS, ControllerState
from specserve.memory import ClusterMemoryParams
from specserve.messages import CONTROLLER_NAME, CONTROLLER_NAMESPACE, BatchingDirective, PolicyDirective
from specserve.replicas.serve.controller_push import ControllerPusher


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", namespace="test-controller-scale")
    yield ray.get_runtime_context().get_node_id()
    ray.shutdown()


def snapshots(count: int, seed: int = 0):
    rng = random.Random(seed)
    # All on one virtual node; their node id is the snapshot's, whichever Ray node the agent runs on.
    return [virtual_snapshot(i, per_node=count, num_models=1, rng=rng) for i in range(count)]


def test_a_node_agent_sends_its_nodes_pushes_in_one_call_and_each_replica_gets_its_own_answer(local_ray):
    params = ClusterMemoryParams(max_concurrent_transfers=1, min_resident_per_deployment=2)
    controller = get_or_create_controller(params)
    agent = get_or_create_node_agent(local_ray)
    try:
        ray.get(controller.usage.remote())
        batch = snapshots(8, seed=3)[::-1]
        answers = ray.get([agent.push.remote(s) for s in batch])
        usage = ray.get(controller.usage.remote())
        assert (usage.num_calls, usage.num_pushes) == (1, 8), "one call carried the node's eight pushes"
        # The same pushes one at a time, in the batch's order (by replica id), decide the same.
        direct = ControllerState(time.monotonic, memory=params)
        expected = {s.replica_id: direct.push(s) for s in sorted(batch, key=lambda s: s.replica_id)}
        assert dict(zip([s.replica_id for s in batch], answers, strict=True)) == expected
        assert any(answers), "the batch asked for something (reloads, offloads) to decide"
    finally:
        ray.kill(agent)
        ray.kill(controller)


def test_a_node_agent_without_a_controller_answers_none_and_finds_one_that_starts_later(local_ray):
    agent = get_or_create_node_agent(local_ray)
    try:
        (one,) = snapshots(1)
        assert ray.get(agent.push.remote(one)) is None
        controller = get_or_create_controller()
        try:
            assert ray.get(agent.push.remote(one)) is not None
        finally:
            ray.kill(controller)
    finally:
        ray.kill(agent)


@ray.remote(num_cpus=0)
class HungController:
    """Answers each push after ``delay_s``: a controller stuck behind a long queue."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.snapshots: list[str] = []

    async def push(self, snapshot):
        self.snapshots.append(snapshot.replica_id)
        await asyncio.sleep(self.delay_s)
        return [PolicyDirective("fixed:k=1")]

    def pushed(self) -> list[str]:
        return self.snapshots


def test_a_hung_controller_never_holds_a_telemetry_round_past_its_deadline(local_ray):
    hung = HungController.options(name=CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE).remote(1.5)
    applied: list[tuple[float, object]] = []

    async def apply(directive) -> None:
        applied.append((time.monotonic(), directive))

    async def rounds() -> list[tuple[float, bool]]:
        pusher = ControllerPusher(local_ray, "none", apply)
        first, second = snapshots(2)
        out = []
        for snapshot in (first, second, second):
            started = time.monotonic()
            answered = await pusher.round(snapshot, deadline_s=started + 0.3)
            out.append((time.monotonic() - started, answered))
        await asyncio.sleep(2.0)  # the first push's answer arrives meanwhile
        out.append((0.0, await pusher.round(second, deadline_s=time.monotonic() + 5.0)))
        return out

    try:
        ray.get(hung.pushed.remote())
        started = time.monotonic()
        results = asyncio.run(rounds())
        waits = [wait for wait, _ in results[:3]]
        assert all(w < 1.0 for w in waits), f"rounds waited {waits} s for a controller that answers in 1.5 s"
        assert [answered for _, answered in results[:3]] == [False, False, False]
        assert results[3][1] is True, "a push that was answered in time counts"
        # One push was out while the next rounds ran: they sent none, so the controller's queue did not grow.
        pushed = ray.get(hung.pushed.remote())
        assert pushed[0] == "replica-00000" and len(pushed) == 2, pushed
        # The late answer was applied before the next push left.
        assert applied[0][0] - started >= 1.5 and len(applied) == 2
    finally:
        ray.kill(hung)


def test_auto_batching_moves_a_replica_to_its_node_agent_once_the_cluster_is_large_and_back_once_it_shrinks(
    local_ray,
):
    controller = get_or_create_controller()
    applied: list[object] = []

    async def apply(directive) -> None:
        applied.append(directive)

    async def push_round(pusher: ControllerPusher, snapshot) -> bool:
        return await pusher.round(snapshot, deadline_s=time.monotonic() + 10.0)

    async def rounds() -> list[bool]:
        pusher = ControllerPusher(local_ray, "auto", apply)
        mine = replace(snapshots(1, seed=7)[0], replica_id="replica-auto")
        seen = [pusher.node]
        assert await push_round(pusher, mine)  # a small cluster: directly, and told nothing
        seen.append(pusher.node)
        # The cluster grows past the threshold: the replica's next answer moves it to its node's agent.
        ray.get(controller.push_many.remote(snapshots(AUTO_BATCH_FROM_REPLICAS, seed=8)))
        calls = ray.get(controller.usage.remote()).num_calls
        assert await push_round(pusher, mine)
        seen.append(pusher.node)
        assert await push_round(pusher, mine)  # through the agent: its own call
        assert ray.get(controller.usage.remote()).num_calls == calls + 2, "one call direct, one by the agent"
        agent = get_or_create_node_agent(local_ray)
        assert ray.get(agent.push.remote(mine)) is not None, "the agent the pusher found is the node's"
        # The others leave: below the lower threshold the replica pushes directly again.
        for s in snapshots(AUTO_BATCH_FROM_REPLICAS, seed=8):
            ray.get(controller.unregister.remote(s.replica_id))
        assert await push_round(pusher, mine)
        seen.append(pusher.node)
        ray.kill(agent)
        return seen

    try:
        assert asyncio.run(rounds()) == [False, False, True, False]
        assert not any(isinstance(d, BatchingDirective) for d in applied), "the pusher's own, never the replica's"
    finally:
        ray.kill(controller)


def test_the_scale_benchmark_lists_every_virtual_replica_and_answers_every_push(local_ray):
    point = run_point(
        replicas=48, duration_s=2, per_node=8, batch="node", num_pushers=2, num_models=2, seed=0, burst_rounds=2
    )
    assert point.listed_every_sample and point.burst_min_listed == 48
    assert point.pushes_skipped == 0 and point.pushes_answered == 48 * 2
    assert point.rounds_unfinished == 0

"""`specserve bench controller`: the cluster controller under the pushes of N virtual replicas.

The controller is the real actor (``ClusterController``) on a local Ray; the replicas are virtual: snapshots
built in code, pushed by a few pusher actors once a second, every replica of a round at once (the worst
alignment of their timers). A replica whose last push is still unanswered skips the round, as a real one does
(``replicas/serve/server.py``), so a slow controller thins the rounds instead of growing its queue for good.
``--batch node`` sends each node's replicas in one ``push_many`` call, as a node agent would.

Per replica count it reports the round time (from a round's start until every push it sent is answered), push
latency percentiles, the fewest replicas the controller listed once all had pushed, the rounds' skipped pushes,
and the actor's CPU (its process's CPU seconds per wall second and per push). The pushers share the machine
with the actor: the actor's CPU per push is what carries over to a cluster whose replicas run elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray

from specserve.controller.actor import ClusterController
from specserve.controller.node_agent import BATCH_WINDOW_S
from specserve.messages import (
    AcceptanceEstimate,
    DraftMemorySnapshot,
    DraftState,
    EngineTelemetry,
    LoadSnapshot,
    PolicySnapshot,
    ReplicaSnapshot,
    SpeculationCounters,
)
from specserve.messages.telemetry import CollapseSnapshot

MAX_K = 4
# A replica's snapshot carries the step durations since its last push: about a second of 15 ms steps.
STEPS_PER_PUSH = 64


def virtual_snapshot(index: int, per_node: int, num_models: int, rng: random.Random) -> ReplicaSnapshot:
    """Replica ``index``: on node ``index // per_node``, serving one of ``num_models`` deployments; its draft
    mostly resident, now and then wanting an offload or offloaded and wanting it back."""
    reached = tuple(float(rng.randint(50, 200)) * 0.8**p for p in range(MAX_K))
    state = rng.choices((DraftState.RESIDENT, DraftState.OFFLOADED), weights=(9, 1))[0]
    engine = EngineTelemetry(
        policy=PolicySnapshot(spec="adaptive", k=rng.randint(0, MAX_K), max_k=MAX_K, info={"alpha": 0.7, "b": 12.0}),
        load=LoadSnapshot(
            num_running=rng.randint(0, 32), num_waiting=0, num_kv_blocks_total=20_000, num_kv_blocks_free=9_000
        ),
        speculation=SpeculationCounters(
            num_steps=10_000,
            num_emitted_tokens=30_000,
            num_steps_by_k=(1000, 2000, 3000, 2000, 2000),
            num_drafted_per_pos=(9000, 7000, 5000, 2000),
            num_reached_per_pos=(9000, 6000, 4000, 1500),
            num_accepted_per_pos=(6000, 4000, 2500, 900),
        ),
        acceptance_ema=AcceptanceEstimate(
            per_pos=(0.7, 0.65, 0.6, 0.55),
            accepted_per_pos=tuple(r * 0.7 for r in reached),
            reached_per_pos=reached,
        ),
        step_durations_s=tuple(0.015 + 0.001 * rng.random() for _ in range(STEPS_PER_PUSH)),
        draft_memory=DraftMemorySnapshot(
            state=state,
            baseline_blocks=18_000,
            draft_bytes=2 * 10**9,
            offload_wanted=state is DraftState.RESIDENT and rng.random() < 0.05,
            reload_wanted=state is DraftState.OFFLOADED and rng.random() < 0.5,
        ),
        collapse=CollapseSnapshot(),
    )
    return ReplicaSnapshot(
        replica_id=f"replica-{index:05d}",
        node_id=f"node-{index // per_node:04d}",
        model_id=f"model-{index % num_models}",
        engine=engine,
    )


@ray.remote(num_cpus=0)
class Pusher:
    """Plays a share of the virtual replicas: groups of snapshots (one replica each, or one node's) pushed every
    round, a group skipped while its last push is unanswered."""

    def __init__(
        self, controller: Any, groups: list[list[ReplicaSnapshot]], offsets_s: list[float], batched: bool
    ) -> None:
        self._controller = controller
        self._groups = groups
        self._offsets_s = offsets_s
        self._batched = batched

    async def warm(self) -> None:
        """One unmeasured round, all answered: connections made, every replica known to the controller."""
        await asyncio.gather(*(self._send(g) for g in range(len(self._groups))))

    async def _send(self, group: int) -> None:
        snapshots = self._groups[group]
        if self._batched:
            # An agent holds a node's pushes for its window before it sends them (node_agent.py).
            await asyncio.sleep(BATCH_WINDOW_S)
            await self._controller.push_many.remote(snapshots)
        else:
            await self._controller.push.remote(snapshots[0])

    async def run(self, start_s: float, rounds: int, period_s: float, burst: bool) -> dict[str, list[float]]:
        """Push ``rounds`` rounds from ``start_s`` (time.time()), each group at its offset in the period, or all at
        the period's start with ``burst``; per push its latency, per round the time until its last push was answered
        (NaN where the run ended first) and the pushes it skipped."""
        in_flight = [False] * len(self._groups)
        latencies: list[float] = []
        round_done = [math.nan] * rounds
        skipped = [0] * rounds
        tasks: list[asyncio.Task] = []

        async def push(group: int, r: int) -> None:
            sent = time.time()
            await self._send(group)
            latencies.extend([time.time() - sent] * len(self._groups[group]))
            in_flight[group] = False
            remaining[r] -= 1
            if not remaining[r]:
                round_done[r] = time.time() - (start_s + r * period_s)

        schedule = sorted(
            (start_s + r * period_s + (0.0 if burst else self._offsets_s[g]), r, g)
            for r in range(rounds)
            for g in range(len(self._groups))
        )
        # Pushes of each round not yet answered or skipped; the round ends when none is left.
        remaining = [len(self._groups)] * rounds
        for at, r, g in schedule:
            if at > time.time() + 0.002:
                await asyncio.sleep(at - time.time())
            if in_flight[g]:
                skipped[r] += len(self._groups[g])
                remaining[r] -= 1
                continue
            in_flight[g] = True
            tasks.append(asyncio.create_task(push(g, r)))
        # Answers still out a period after the last round do not count: the run is over.
        await asyncio.wait(tasks, timeout=max(0.0, start_s + (rounds + 1) * period_s - time.time()))
        return {"latency_s": latencies, "round_s": round_done, "skipped": [float(s) for s in skipped]}


# Rounds with every replica pushing at once, after the spread ones: the round time of the worst alignment.
BURST_ROUNDS = 5


@dataclass(slots=True)
class PointResult:
    replicas: int
    batch: str
    per_node: int
    # Spread rounds (each replica, or node, at its own phase of the second): latency, listing, the actor's CPU.
    duration_s: float
    pushes_answered: int
    pushes_skipped: int
    latency_s_p50: float
    latency_s_p99: float
    min_listed: int
    listed_every_sample: bool
    actor_cpu_per_s: float
    actor_cpu_us_per_push: float
    # Burst rounds (all at once): from a round's start until its last push is answered.
    round_s_p50: float
    round_s_max: float
    rounds_unfinished: int
    burst_min_listed: int
    listed_samples: list[int] = field(default_factory=list)


def run_point(
    replicas: int,
    duration_s: float,
    per_node: int,
    batch: str,
    num_pushers: int,
    num_models: int,
    seed: int,
    burst_rounds: int = BURST_ROUNDS,
) -> PointResult:
    rng = random.Random(seed)
    snapshots = [virtual_snapshot(i, per_node, num_models, rng) for i in range(replicas)]
    size = per_node if batch == "node" else 1
    groups = [snapshots[i : i + size] for i in range(0, replicas, size)]
    offsets = [j / len(groups) for j in range(len(groups))]
    # A fresh controller per point, not the cluster's named one: nothing of a previous point carries over.
    controller = ClusterController.remote()  # type: ignore[attr-defined]
    pushers = [
        Pusher.remote(  # type: ignore[attr-defined]
            controller, groups[p::num_pushers], offsets[p::num_pushers], batch == "node"
        )
        for p in range(num_pushers)
    ]
    ray.get([p.warm.remote() for p in pushers])
    try:
        before = ray.get(controller.usage.remote())
        spread, listed, wall = _rounds(controller, pushers, max(2, int(duration_s)), burst=False)
        after = ray.get(controller.usage.remote())
        burst, burst_listed, _ = _rounds(controller, pushers, burst_rounds, burst=True)
    finally:
        for actor in (*pushers, controller):
            ray.kill(actor)
    latencies = np.array([x for r in spread for x in r["latency_s"]])
    per_pusher = np.array([r["round_s"] for r in burst])
    unfinished = np.isnan(per_pusher).any(axis=0)
    round_s = per_pusher.max(axis=0)[~unfinished]  # a round ends with its slowest pusher
    return PointResult(
        replicas=replicas,
        batch=batch,
        per_node=per_node,
        duration_s=round(wall, 2),
        pushes_answered=int(latencies.size),
        pushes_skipped=int(sum(sum(r["skipped"]) for r in spread)),
        latency_s_p50=_round(float(np.percentile(latencies, 50))) if latencies.size else math.nan,
        latency_s_p99=_round(float(np.percentile(latencies, 99))) if latencies.size else math.nan,
        min_listed=min(listed, default=0),
        listed_every_sample=bool(listed) and min(listed) == replicas,
        actor_cpu_per_s=_round((after.cpu_s - before.cpu_s) / wall),
        actor_cpu_us_per_push=_round((after.cpu_s - before.cpu_s) / max(1, after.num_pushes - before.num_pushes) * 1e6),
        round_s_p50=_round(float(np.median(round_s))) if round_s.size else math.nan,
        round_s_max=_round(float(round_s.max())) if round_s.size else math.nan,
        rounds_unfinished=int(unfinished.sum()),
        burst_min_listed=min(burst_listed, default=0),
        listed_samples=listed,
    )


def _rounds(controller: Any, pushers: list[Any], rounds: int, burst: bool) -> tuple[list[dict], list[int], float]:
    """Every pusher's ``rounds`` rounds; the controller's count of live replicas, read once a second meanwhile."""
    period_s = 1.0
    start_s = time.time() + 1.0
    runs = [p.run.remote(start_s, rounds, period_s, burst) for p in pushers]
    listed: list[int] = []
    # Every replica pushed in the warm-up round: from the start on, each read should count them all.
    time.sleep(max(0.0, start_s - time.time()))
    while time.time() < start_s + rounds * period_s:
        listed.append(ray.get(controller.usage.remote()).num_replicas)
        time.sleep(max(0.0, 1.0 - (time.time() - start_s) % 1.0))
    results = ray.get(runs)
    return results, listed, time.time() - start_s


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def plot(points: list[PointResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for batch in sorted({p.batch for p in points}):
        mine = sorted((p for p in points if p.batch == batch), key=lambda p: p.replicas)
        x = [p.replicas for p in mine]
        label = "one call per replica" if batch == "none" else "one call per node"
        axes[0].plot(x, [p.round_s_max for p in mine], "o-", label=f"{label}: slowest round")
        axes[0].plot(x, [p.round_s_p50 for p in mine], "o--", label=f"{label}: median round")
        axes[1].plot(x, [p.latency_s_p99 * 1e3 for p in mine], "o-", label=f"{label}: p99")
        axes[1].plot(x, [p.latency_s_p50 * 1e3 for p in mine], "o--", label=f"{label}: p50")
        style = "o-" if batch == "none" else "s--"  # both lie on 1.0 when every replica is listed
        axes[2].plot(x, [min(p.min_listed, p.burst_min_listed) / p.replicas for p in mine], style, label=label)
    axes[0].axhline(0.5, color="grey", lw=0.8, ls=":")
    axes[1].axhline(100, color="grey", lw=0.8, ls=":")
    for ax, title, unit in (
        (axes[0], "round time, every replica at once", "s"),
        (axes[1], "push latency, replicas spread over the second", "ms"),
        (axes[2], "fewest replicas listed / replicas", "share"),
    ):
        ax.set_xscale("log")
        ax.set_xlabel("virtual replicas")
        ax.set_title(title)
        ax.set_ylabel(unit)
        ax.legend(fontsize=7)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    axes[2].set_ylim(0, 1.05)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: Any) -> int:
    """The command: every (replica count, batching) point, a table on stderr, JSON on stdout with --json."""
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(num_cpus=args.num_cpus, include_dashboard=False, logging_level="ERROR")
    points: list[PointResult] = []
    try:
        for batch in args.batch:
            for n in args.replicas:
                point = run_point(n, args.duration, args.per_node, batch, args.pushers, args.models, args.seed)
                points.append(point)
                print(
                    f"{n:>6} replicas, {batch:>4}: spread: push p50 {point.latency_s_p50 * 1e3:.3g} ms "
                    f"p99 {point.latency_s_p99 * 1e3:.3g} ms, listed >= {point.min_listed}, skipped "
                    f"{point.pushes_skipped}, actor {point.actor_cpu_per_s:.2f} CPU "
                    f"({point.actor_cpu_us_per_push:.0f} us a push); burst: round p50 {point.round_s_p50:.3g} s "
                    f"max {point.round_s_max:.3g} s ({point.rounds_unfinished} unfinished), "
                    f"listed >= {point.burst_min_listed}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        if started_here:
            ray.shutdown()
    document = {"command": " ".join(sys.argv), "points": [asdict(p) for p in points]}
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(document, indent=1) + "\n")
        plot(points, out.with_suffix(".png"))
        print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}", file=sys.stderr)
    if args.json:
        print(json.dumps(document))
    return 0

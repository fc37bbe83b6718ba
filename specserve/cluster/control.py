"""The client side of the cluster's control plane: reach the running cluster's controller, read the
replicas' snapshots, queue a policy and wait until every replica runs it.

`specserve status` and `specserve policy set` use it, and so does `specserve bench compare` through
``PolicySwitch`` (the bench package talks HTTP only, so the cluster side hands it this object).
Ray is imported inside the functions: building the command line must not load it.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

from specserve.messages import ReplicaSnapshot
from specserve.speculation import EngineTraits, make_policy, split_specs

# Engines are started with max_k <= 16 (ServeConfig), so a spec valid here is valid for some engine.
_OFFLINE_TRAITS = EngineTraits(max_k=16)
POLL_S = 0.25


class CommandError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def connect() -> None:
    from specserve.cluster.local import cluster_address

    address = cluster_address()  # before importing ray: it may set RAY_AUTH_MODE, read at import
    if address is None:
        raise CommandError("no running specserve cluster: start one with `specserve serve`, or set RAY_ADDRESS")
    import ray

    # Ray's driver prints the cluster's error messages (a node has died, ...) to stdout, from a thread of its own
    # and at any time; a command's results must stay alone there.
    if not isinstance(sys.stdout, _MainThreadOnly):
        sys.stdout = _MainThreadOnly(sys.stdout, sys.stderr)
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    except (ConnectionError, RuntimeError) as exc:
        raise CommandError(f"cannot reach the Ray cluster at {address}: {exc}") from None


class _MainThreadOnly:
    """A stream that takes the main thread's writes; other threads' go to ``elsewhere``."""

    def __init__(self, stream: TextIO, elsewhere: TextIO) -> None:
        self._stream, self._elsewhere = stream, elsewhere

    def write(self, text: str) -> int:
        main = threading.current_thread() is threading.main_thread()
        return (self._stream if main else self._elsewhere).write(text)

    def flush(self) -> None:
        self._stream.flush()
        self._elsewhere.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def controller() -> Any:
    connect()
    from specserve.controller.actor import get_controller

    handle = get_controller()
    if handle is None:
        raise CommandError("the cluster has no specserve controller: is `specserve serve` running?")
    return handle


def snapshots(handle: Any) -> list[ReplicaSnapshot]:
    import ray

    return ray.get(handle.replicas.remote())


def canonical_policy(spec: str, max_ks: set[int] | None = None) -> str:
    """The spec as engines report it (``fixed:k=3`` runs as ``fixed``), checked against each max_k.

    Checking here matters: a directive that fails in a replica could only be logged there.
    """
    try:
        policies = [make_policy(spec, EngineTraits(max_k=k)) for k in sorted(max_ks or ())]
        return (policies[0] if policies else make_policy(spec, _OFFLINE_TRAITS)).spec
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def parse_policies(text: str) -> list[str]:
    """A comma-separated policy list, checked against the registry with no cluster; the specs as written.

    Two entries that run as the same policy (``fixed`` and ``fixed:k=3``) are an error: a comparison
    would measure one policy twice under two names.
    """
    try:
        specs = split_specs(text)
    except ValueError as exc:
        raise CommandError(f"--policies: {exc}") from None
    seen: dict[str, str] = {}
    for spec in specs:
        canonical = canonical_policy(spec)
        if canonical in seen:
            raise CommandError(f"--policies: {seen[canonical]!r} and {spec!r} are the same policy ({canonical})")
        seen[canonical] = spec
    return list(seen.values())


def queue_policy(handle: Any, spec: str, replica: str | None = None) -> tuple[str, list[str]]:
    """Validate ``spec`` against the targeted engines and queue it; returns its canonical form and the
    replica ids it went to."""
    import ray

    max_ks = {s.engine.policy.max_k for s in snapshots(handle) if replica in (None, s.replica_id)}
    canonical = canonical_policy(spec, max_ks)
    try:
        targets = ray.get(handle.set_policy.remote(spec, replica))
    except ray.exceptions.RayTaskError as exc:
        raise CommandError(str(exc.cause) if exc.cause else str(exc)) from None
    return canonical, targets


class PolicySwitch:
    """Switches the whole cluster's policy and returns once every replica runs it, idle.

    A directive reaches a replica with its next telemetry push and shows in the snapshot after that
    (one to two seconds), so ``switch`` polls the snapshots instead of sleeping a fixed time. A
    snapshot showing the new spec proves the switch only when the spec differs from the one before;
    callers that need a fresh policy instance must therefore never switch to the spec already running.
    """

    def __init__(self, timeout_s: float = 60.0) -> None:
        self.handle = controller()
        self.timeout_s = timeout_s

    def replicas(self) -> list[ReplicaSnapshot]:
        return snapshots(self.handle)

    def canonical(self, spec: str) -> str:
        return canonical_policy(spec, {s.engine.policy.max_k for s in self.replicas()})

    def model_ids(self) -> set[str]:
        return {s.model_id for s in self.replicas()}

    def current(self) -> str | None:
        """The policy every replica runs, or None when they differ or none has reported."""
        policies = {s.engine.policy.spec for s in self.replicas()}
        return policies.pop() if len(policies) == 1 else None

    def switch(self, spec: str) -> list[int]:
        """Queue ``spec`` for every replica and wait until all run it, idle; returns the engines' steps
        per k so far, summed over replicas, from the snapshots that show the switch."""
        canonical, targets = queue_policy(self.handle, spec)
        if not targets:
            raise CommandError("no replica has reported to the controller: is the deployment up?")
        deadline = time.monotonic() + self.timeout_s
        while True:
            live = self.replicas()
            # Idle too: a request the client gave up on may still run, and would run under the new policy.
            lagging = [
                s.replica_id
                for s in live
                if s.engine.policy.spec != canonical or s.engine.load.num_running or s.engine.load.num_waiting
            ]
            if live and not lagging:
                steps = [0] * max(len(s.engine.speculation.num_steps_by_k) for s in live)
                for snapshot in live:
                    for k, n in enumerate(snapshot.engine.speculation.num_steps_by_k):
                        steps[k] += n
                return steps
            if time.monotonic() > deadline:
                where = ", ".join(lagging) or "none live"
                raise CommandError(
                    f"policy {canonical} not running idle on every replica after {self.timeout_s:g} s: {where}"
                )
            time.sleep(POLL_S)

"""Where a served load's CPU time goes: the CPU seconds of every process in a tree, grouped by role.

On a machine with few cores the engine shares them with the HTTP proxy, the ingress, Ray's own processes and
the load generator, so a throughput gap between two ways of serving the same engine is explained by who else
ran. ``CpuTally`` reads ``psutil`` CPU times (user + system) of a process and its descendants before and after a
load; processes that started or ended in between count from zero or are lost (their time is not in the tally).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import psutil

from specserve.replicas.config.cpu_affinity import cores_of, is_engine_title, set_cores

# Ray names its worker processes after the actor they host (``ray::ServeReplica:app:LLMServer...``);
# vLLM names the engine's processes ``VLLM::EngineCore`` / ``VLLM::Worker...``. First match wins.
ROLES = (
    ("LLMServer", "serve replica (LLMServer)"),
    ("Ingress", "ingress"),
    ("ProxyActor", "HTTP proxy"),
    ("ServeController", "Ray: Serve controller"),
    ("ClusterController", "specserve controller"),
    ("raylet", "Ray: raylet"),
    ("gcs_server", "Ray: GCS"),
    ("dashboard", "Ray: dashboard"),
    ("log_monitor", "Ray: log monitor"),
    ("runtime_env", "Ray: runtime env agent"),
    ("ray::", "Ray: other actors"),
)


def role_of(process: psutil.Process) -> str:
    try:
        command_line = process.cmdline()
    except psutil.Error:
        return "gone"
    # A process part-way through exiting has already dropped its command line (but is not yet a zombie, which
    # psutil would report as an error): it is gone, and keeps the role it was last seen with.
    if not command_line:
        return "gone"
    if is_engine_title(command_line[0]):
        return "engine"
    title = " ".join(command_line)
    for needle, role in ROLES:
        if needle in title:
            return role
    return "other"


def cpu_seconds(root_pid: int, root_role: str = "") -> dict[int, tuple[str, float]]:
    """pid -> (role, user + system CPU seconds) for ``root_pid`` (its role ``root_role`` if given) and every
    descendant."""
    out: dict[int, tuple[str, float]] = {}
    for process in _tree(root_pid, ()):
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        role = root_role if process.pid == root_pid and root_role else role_of(process)
        out[process.pid] = (role, times.user + times.system)
    return out


@dataclass
class CpuTally:
    """CPU seconds by role over one load: ``start()``, run the load, ``stop()``."""

    root_pid: int
    root_role: str = ""
    extra: dict[int, str] = field(default_factory=dict)  # processes outside the tree (pid -> role)
    roles: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    _before: dict[int, tuple[str, float]] = field(default_factory=dict)
    _started: float = 0.0
    # The role each process was last seen with: an ended, unreaped child has no command line to read.
    _roles: dict[int, str] = field(default_factory=dict)

    def start(self) -> None:
        self._before = self._read()
        self._started = time.perf_counter()

    def stop(self) -> dict[str, float]:
        self.wall_s = time.perf_counter() - self._started
        after = self._read()
        roles: dict[str, float] = defaultdict(float)
        for pid, (role, seconds) in after.items():
            roles[role] += seconds - self._before.get(pid, (role, 0.0))[1]
        self.roles = {role: round(seconds, 3) for role, seconds in sorted(roles.items()) if seconds > 0.0005}
        return self.roles

    def _read(self) -> dict[int, tuple[str, float]]:
        out = cpu_seconds(self.root_pid, self.root_role)
        for pid, role in self.extra.items():
            try:
                times = psutil.Process(pid).cpu_times()
            except psutil.Error:
                continue
            out[pid] = (role, times.user + times.system)
        for pid, (role, seconds) in out.items():
            if role == "gone":
                out[pid] = (self._roles.get(pid, role), seconds)
            else:
                self._roles[pid] = role
        return out

    def report(self, output_tokens: int) -> dict[str, object]:
        total = sum(self.roles.values())
        return {
            "wall_s": round(self.wall_s, 3),
            "cpu_s_by_role": self.roles,
            "cores_busy": round(total / self.wall_s, 3) if self.wall_s else 0.0,
            "engine_share_of_cpu": round(self.roles.get("engine", 0.0) / total, 3) if total else 0.0,
            "cpu_ms_per_output_token": {
                role: round(1e3 * seconds / output_tokens, 3) for role, seconds in self.roles.items()
            }
            if output_tokens
            else {},
        }


def _tree(root_pid: int, extra: tuple[int, ...]) -> list[psutil.Process]:
    processes = []
    try:
        root = psutil.Process(root_pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        pass
    for pid in extra:
        try:
            processes.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return processes


def pin_engine(root_pid: int, engine_cores: set[int], other_cores: set[int], extra: tuple[int, ...] = ()) -> None:
    """Give the engine cores of its own: every thread of the engine's processes (role ``engine``) under
    ``root_pid`` on ``engine_cores``, every thread of every other process in the tree (and of ``extra``) on
    ``other_cores``. What a GPU node has: the model computes where the serving processes do not run. Threads
    and processes started later inherit their creator's cores (``cores_by_role`` tells whether it held)."""
    for process in _tree(root_pid, extra):
        set_cores(process, engine_cores if role_of(process) == "engine" else other_cores)


def cores_by_role(root_pid: int, extra: tuple[int, ...] = ()) -> dict[str, list[int]]:
    """Role -> the cores its processes' threads may run on (the union over them)."""
    held: dict[str, set[int]] = defaultdict(set)
    for process in _tree(root_pid, extra):
        held[role_of(process)] |= cores_of(process)
    return {role: sorted(cores) for role, cores in sorted(held.items())}

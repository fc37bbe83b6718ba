"""`specserve serve` as a real subprocess, with its whole process tree tracked for clean-up checks."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

# The bearer token the endpoint package's server requires (its clients send it; the key tests check it leaks nowhere).
API_KEY = "sk-specserve-test-7f3a91c2d4"

# Below Linux's ephemeral range (32768-60999), which Ray's own processes bind at random while a cluster starts,
# and above Ray's worker ports (10002-19999): a port found free here is not taken before Serve binds it.
_PORT_RANGE = (20000, 32000)


def free_port() -> int:
    rng = random.Random()
    for _ in range(100):
        port = rng.randrange(*_PORT_RANGE)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_PORT_RANGE} after 100 tries")


def _interruptible() -> None:
    """A child inherits its parent's ignored and blocked signals across exec; a SIGINT ignored or blocked there
    makes Ctrl-C (how `serve run` is told to stop) a no-op. The test process may have either by then (a library
    loaded earlier in the suite), so the child starts with both reset."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def signal_state(pid: int) -> str:
    """The kernel's view of a process's signals: pending, blocked, ignored and caught masks."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError as error:
        return str(error)
    return " ".join(
        line.replace("\t", "=")
        for line in status.splitlines()
        if line.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt"))
    )


class TrackedProcess:
    """A command in a session of its own, its output kept, its whole process tree stoppable by PID."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env, self.log_path = env, log_path
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []

    def launch(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(
            cmd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            preexec_fn=_interruptible,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def wait_for_line(self, pattern: str, timeout_s: float) -> re.Match:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if match := re.match(pattern, line):
                    return match
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.proc.args[:4]} exited with {self.proc.returncode}:\n{self.tail()}")
            time.sleep(0.5)
        raise TimeoutError(f"no line matching {pattern!r} in {timeout_s} s:\n{self.tail()}")

    def line_matching(self, pattern: str) -> str | None:
        return next((line for line in self.lines if re.match(pattern, line)), None)

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def descendants_named(self, name: str) -> list[psutil.Process]:
        """Running descendants whose process name is ``name`` (Ray and vLLM set titles such as VLLM::EngineCore)."""
        found = []
        for process in self.descendants():
            with contextlib.suppress(psutil.NoSuchProcess):
                if process.name() == name:
                    found.append(process)
        return found

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 120.0) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout_s)

    @staticmethod
    def wait_gone(tree: list[psutil.Process], timeout_s: float = 60.0) -> list[psutil.Process]:
        """Waits for every process of ``tree`` to exit; returns those still running at the deadline."""
        deadline = time.monotonic() + timeout_s
        while alive := [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]:
            if time.monotonic() > deadline:
                return alive
            time.sleep(0.5)
        return []

    def kill_tree(self) -> None:
        """Last resort for a failed test: this process group and every descendant we saw."""
        if self.proc is None or self.proc.poll() is not None:
            return
        tree = self.descendants()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for child in tree:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass

    def tail(self, n: int = 60) -> str:
        return "".join(self.lines[-n:])

    def _read(self) -> None:
        with open(self.log_path, "w") as log:
            for line in self.proc.stdout:
                self.lines.append(line)
                log.write(line)
                log.flush()


class ServeProcess(TrackedProcess):
    """`specserve serve` as a subprocess."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        super().__init__(env, log_path)
        self.args = args

    def start(self, timeout_s: float = 600.0) -> str:
        """Start and wait for the `endpoint:` line; returns the endpoint URL."""
        self.begin()
        return self.wait_endpoint(timeout_s)

    def begin(self) -> None:
        self.launch([sys.executable, "-m", "specserve.cluster.cli", "serve", *self.args])

    def wait_endpoint(self, timeout_s: float = 600.0) -> str:
        return self.wait_for_line(r"endpoint: (\S+)", timeout_s).group(1)


def specserve_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """A `specserve` command (status, policy set, ...) run as an operator would, against the cluster in ``env``."""
    return subprocess.run(
        [sys.executable, "-m", "specserve.cluster.cli", *args], env=env, capture_output=True, text=True, timeout=120
    )


def wait_for_replica(server: TrackedProcess, until=lambda replica: True, timeout_s: float = 60.0) -> dict:
    """The first replica as `status --json` shows it, once ``until`` holds for it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = specserve_cli(server.env, "status", "--json")
        if done.returncode == 0 and (replicas := json.loads(done.stdout)["replicas"]) and until(replicas[0]):
            return replicas[0]
        time.sleep(0.5)
    raise TimeoutError(f"no replica reported as expected within {timeout_s} s")


@contextlib.contextmanager
def serving(args: list[str], folder: Path, **env: str) -> Iterator[ServeProcess]:
    """`specserve serve ARGS` on a local Ray cluster of its own (RAY_ADDRESS unset), its state and log under
    ``folder`` and ``env`` added to its environment; yields it with ``endpoint`` set once it answers, and
    removes its whole process tree after, whatever the test did."""
    environment = dict(os.environ, SPECSERVE_STATE_DIR=str(folder / "state"), **env)
    environment.pop("RAY_ADDRESS", None)
    process = ServeProcess(args, environment, folder / "serve.log")
    try:
        process.endpoint = process.start()
        yield process
    finally:
        process.kill_tree()


def processes_under(folder: Path) -> list[psutil.Process]:
    """Running processes whose command line names ``folder``: a Ray cluster started with its temporary folder
    there (TMPDIR) names it in every one of its processes, wherever they were reparented."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if str(folder) in " ".join(process.info["cmdline"] or ()) and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.NoSuchProcess:
            continue
    return found

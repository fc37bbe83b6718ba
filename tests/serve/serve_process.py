"""`specserve serve` as a real subprocess, with its whole process tree tracked for clean-up checks."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServeProcess:
    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.args, self.env, self.log_path = args, env, log_path
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []
        self._reader: threading.Thread | None = None

    def start(self, timeout_s: float = 600.0) -> str:
        """Start and wait for the `endpoint:` line; returns the endpoint URL."""
        cmd = [sys.executable, "-m", "specserve.cluster.cli", "serve", *self.args]
        # A session of its own: if a test fails, the finaliser can stop exactly this tree.
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if match := re.match(r"endpoint: (\S+)", line):
                    return match.group(1)
            if self.proc.poll() is not None:
                raise RuntimeError(f"specserve serve exited with {self.proc.returncode}:\n{self.tail()}")
            time.sleep(0.5)
        raise TimeoutError(f"specserve serve not ready in {timeout_s} s:\n{self.tail()}")

    def line_matching(self, pattern: str) -> str | None:
        return next((line for line in self.lines if re.match(pattern, line)), None)

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 120.0) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout_s)

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

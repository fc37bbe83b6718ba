"""A real Prometheus server (Debian's `prometheus` binary) as a child process: `specserve serve --prometheus-port`
runs one scraping its local cluster, and the observability tests run the same class.

Standard library only (urllib): the package does not depend on `requests` at run time.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

INSTALL_HINT = "apt-get install prometheus (scripts/install.sh does it when run as root)"
RULES_FILE = "alerts.yml"


class PrometheusError(RuntimeError):
    """Prometheus did not start, or stopped answering."""


def query(url: str, promql: str) -> list[dict[str, Any]]:
    """An instant query's result vector from the Prometheus at ``url``. Raises urllib.error.HTTPError for a bad
    query (400) or one asked before the server is ready (503)."""
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=10) as r:
        result: list[dict[str, Any]] = json.load(r)["data"]["result"]
    return result


def alerting_rules(url: str) -> list[dict[str, Any]]:
    """Every alerting rule the Prometheus at ``url`` loaded, across its groups, as its rules API reports them
    (``name``, ``health``: ok, err or unknown before the first evaluation, ``lastError``, ``state``)."""
    with urllib.request.urlopen(f"{url}/api/v1/rules?type=alert", timeout=10) as r:
        groups: list[dict[str, Any]] = json.load(r)["data"]["groups"]
    return [rule for group in groups for rule in group["rules"]]


def wait_for(url: str, promql: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """The query's result once it is not empty."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if result := query(url, promql):
                return result
        except urllib.error.HTTPError as exc:
            if exc.code != 503:  # 503: still starting; anything else is a bad query
                raise
        except (urllib.error.URLError, OSError):
            pass  # not listening yet
        time.sleep(1.0)
    raise TimeoutError(f"Prometheus at {url} never returned data for {promql!r}")


class PrometheusServer:
    """One Prometheus process with its configuration, TSDB and log under ``workdir``.

    ``targets``: ``host:port`` addresses scraped every ``scrape_interval_s`` by one job; ``config``: a whole
    prometheus.yml to run instead. ``host`` is the address its HTTP API and UI bind. ``rules``: a rules file's
    document (``alert_rules.rules_document()``), evaluated every scrape interval; with ``targets`` only.
    """

    def __init__(
        self,
        workdir: Path,
        port: int,
        targets: Sequence[str] = (),
        *,
        scrape_interval_s: float = 1.0,
        config: str | None = None,
        host: str = "127.0.0.1",
        job_name: str = "specserve",
        rules: dict[str, Any] | None = None,
    ) -> None:
        if config is None and not targets:
            raise ValueError("PrometheusServer needs scrape targets or a whole config")
        if config is not None and rules is not None:
            raise ValueError("PrometheusServer: a whole config names its own rule files")
        self.workdir, self.port, self.host = Path(workdir), port, host
        self.targets, self.scrape_interval_s, self.job_name = tuple(targets), scrape_interval_s, job_name
        self.config, self.rules = config, rules
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def binary() -> str | None:
        return shutil.which("prometheus")

    @property
    def url(self) -> str:
        """Base URL for clients (its UI, `/api/v1/...`): loopback where it binds every address."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "prometheus.log"

    def config_text(self) -> str:
        if self.config is not None:
            return self.config
        interval = f"{self.scrape_interval_s:g}s"
        document = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [{"job_name": self.job_name, "static_configs": [{"targets": list(self.targets)}]}],
        }
        if self.rules is not None:
            document["rule_files"] = [RULES_FILE]
        return json.dumps(document, indent=2) + "\n"  # JSON is YAML

    def start(self) -> None:
        binary = self.binary()
        if binary is None:
            raise PrometheusError(f"no `prometheus` binary on PATH ({INSTALL_HINT})")
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(self.config_text())
        if self.rules is not None:  # beside the config: Prometheus reads rule_files relative to it
            (self.workdir / RULES_FILE).write_text(json.dumps(self.rules, indent=2) + "\n")
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address={f'[{self.host}]' if ':' in self.host else self.host}:{self.port}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Until `/-/ready` answers 200; raises PrometheusError (with its log's tail) if it exits or never does."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise PrometheusError(f"prometheus exited (status {code}):\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise PrometheusError(
                    f"prometheus not ready at {self.url} within {timeout_s:.0f} s:\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def query(self, promql: str) -> list[dict[str, Any]]:
        return query(self.url, promql)

    def wait_for(self, promql: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        return wait_for(self.url, promql, timeout_s)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (Prometheus flushes its head block), then SIGKILL after ``timeout_s``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

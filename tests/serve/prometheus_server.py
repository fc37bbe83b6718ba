"""A real Prometheus server (Debian's `prometheus`) scraping a target, for the observability tests."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import requests


class PrometheusServer:
    def __init__(self, scrape_target: str, workdir: Path, port: int, config: str | None = None) -> None:
        """``config``: a whole prometheus.yml to run instead of one that scrapes ``scrape_target``."""
        self.scrape_target, self.workdir, self.port, self.config = scrape_target, workdir, port, config
        self.proc: subprocess.Popen | None = None

    @staticmethod
    def binary() -> str | None:
        return shutil.which("prometheus")

    def start(self) -> None:
        config = self.workdir / "prometheus.yml"
        config.write_text(
            self.config
            or "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"scrape_configs: [{{job_name: specserve, static_configs: [{{targets: ['{self.scrape_target}']}}]}}]\n"
        )
        self.proc = subprocess.Popen(
            [
                self.binary(),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(self.workdir / "prometheus.log").open("w"),
        )

    def query(self, promql: str) -> list[dict]:
        response = requests.get(f"http://127.0.0.1:{self.port}/api/v1/query", params={"query": promql}, timeout=10)
        response.raise_for_status()
        return response.json()["data"]["result"]

    def wait_for(self, promql: str, timeout_s: float = 60.0) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if result := self.query(promql):
                    return result
            except requests.RequestException:
                pass  # still starting
            time.sleep(1.0)
        raise TimeoutError(f"Prometheus never returned data for {promql!r}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)

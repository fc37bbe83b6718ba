"""Serve tier, last in the package: SIGTERM stops the package's server and everything it started."""

from __future__ import annotations

import psutil

from specserve.cluster import prometheus


def test_sigterm_stops_everything(server):
    tree = server.descendants()
    assert len(tree) >= 5, "Ray, Serve and the engine run under the serve process"
    started = [p for p in tree if p.name() == "prometheus"]
    if prometheus.PrometheusServer.binary() is not None:
        assert len(started) == 1, "--prometheus-port's Prometheus runs under serve"
    assert server.stop() == 0
    alive = server.wait_gone(tree, timeout_s=30)
    assert not alive, f"left running: {[(p.pid, p.name()) for p in alive]}"
    assert not [p.pid for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], "Prometheus stopped"

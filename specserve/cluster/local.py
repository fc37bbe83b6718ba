"""`specserve serve`: start (or join) a Ray cluster, deploy the app, wait for a signal, clean up."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path

from pydantic import SecretStr

from specserve.cluster import alert_rules
from specserve.cluster.app import ResolvedServe, build_app, engine_path, memory_params, resolve_serve
from specserve.cluster.config import ConfigError, ServeConfig, note_folders_not_here, require_folders_here
from specserve.cluster.prometheus import INSTALL_HINT, PrometheusError, PrometheusServer
from specserve.replicas.config.cpu_affinity import spans, split_cores

APP_NAME = "specserve"
# Ray's metrics agent exports every replica's values about every 10 s (RAY_metrics_report_interval_ms). Scraping
# twice per export round puts each exported value in Prometheus within 5 s and never skips a round when the two
# clocks drift apart (scraping every 10 s could); scraping faster would only store the same values again.
PROMETHEUS_SCRAPE_INTERVAL_S = 5.0


#: Ray Serve's switch for its throughput-optimized mode (ServeConfig.throughput_optimized).
THROUGHPUT_OPTIMIZED_ENV = "RAY_SERVE_THROUGHPUT_OPTIMIZED"
#: Ray Serve's switch for HAProxy in place of its Python HTTP proxies (ServeConfig.haproxy).
HAPROXY_ENV = "RAY_SERVE_ENABLE_HA_PROXY"
#: The ServeConfig keys that switch a Serve mode, and the variable each sets (``_serve_mode``).
SERVE_SWITCHES = {"throughput_optimized": THROUGHPUT_OPTIMIZED_ENV, "haproxy": HAPROXY_ENV}


def state_file() -> Path:
    """Where a running `specserve serve` records its Ray address for `specserve status`."""
    root = os.environ.get("SPECSERVE_STATE_DIR") or Path.home() / ".cache" / "specserve"
    return Path(root) / "cluster.json"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def resolve(config: ServeConfig, tmp_dir: str) -> ResolvedServe:
    """The config resolved for this machine, vLLM's caches and IPC sockets under ``tmp_dir`` (deleted on exit)."""
    if config.model_source is None:
        log("specserve: using the bundled tiny trained pair (built once, then cached)")
    return resolve_serve(config, tmp_dir)


def serve_forever(config: ServeConfig) -> int:
    """Run until SIGINT/SIGTERM; always tear down what was started. Returns the exit code."""
    if os.environ.get("RAY_ADDRESS"):
        note_folders_not_here(config, "specserve serve")
    else:
        require_folders_here(config, "the local cluster's replicas load it")
    _serve_mode(config)  # before Serve's modules load here, and before the cluster's processes inherit it
    import ray
    from ray import serve

    from specserve.controller.actor import get_or_create_controller

    _require_free_ports(config)
    _require_prometheus(config)
    stop = threading.Event()
    _on_stop_signals(stop)

    with ExitStack() as cleanup:
        tmp_dir = tempfile.mkdtemp(prefix="specserve-")
        cleanup.callback(shutil.rmtree, tmp_dir, ignore_errors=True)
        # Engines get their environment through the replicas' runtime_env; the driver keeps its own
        # (a TMPDIR under tmp_dir would push Ray's socket paths past the 107-byte AF_UNIX limit).
        if not os.environ.get("RAY_ADDRESS"):
            # Before anything starts a thread here (building the LLMConfig does): threads inherit this one's cores.
            _keep_serving_off_engine_cores(config)
        resolved = resolve(config, tmp_dir)

        joined = _start_ray(config, resolved)
        cleanup.callback(ray.shutdown)
        _require_capacity(config, resolved.on_gpu, joined)
        _on_stop_signals(stop)  # again: the Ray driver installs its own SIGTERM handler
        prometheus = None
        if config.server.prometheus_port is not None and not joined:
            # Started before the engines, so that it records their start-up too.
            prometheus = PrometheusServer(
                Path(tmp_dir) / "prometheus",
                config.server.prometheus_port,
                [f"127.0.0.1:{config.server.metrics_port}"],
                scrape_interval_s=PROMETHEUS_SCRAPE_INTERVAL_S,
                host=config.server.host,
                rules=alert_rules.rules_document(),
            )
            cleanup.callback(prometheus.stop)  # before tmp_dir (its TSDB) goes: the stack unwinds last in, first out
            try:
                prometheus.start()
                prometheus.wait_ready()
            except PrometheusError as exc:
                log(f"specserve: --prometheus-port {config.server.prometheus_port}: {exc}")
                return 1
        get_or_create_controller(memory_params(config))
        serve.start(
            proxy_location=config.server.proxy_location,
            http_options={"host": config.server.host, "port": config.server.port},
        )
        cleanup.callback(_shutdown_serve, joined)
        if stop.is_set():
            return 130

        log(
            f"specserve: deploying {config.num_replicas} replica(s) of {resolved.model_id} "
            f"(policy {config.speculation.policy}) on {engine_path(resolved.on_gpu)}"
        )
        started = time.monotonic()
        failure: list[BaseException] = []
        app = build_app(resolved)
        # serve.run blocks until every replica's engine is up (tens of seconds); a thread keeps
        # Ctrl-C answered meanwhile.
        deployer = threading.Thread(target=_deploy, args=(app, failure, stop), daemon=True)
        endpoint = f"http://{_client_host(config.server.host)}:{config.server.port}/v1"
        # Recorded before the endpoint answers, so that a script which waits for the endpoint and then runs
        # `specserve status` or `policy set` finds the cluster.
        _write_state(ray.get_runtime_context().gcs_address, endpoint)
        cleanup.callback(state_file().unlink, missing_ok=True)
        deployer.start()
        if not _wait_ready(endpoint, deployer, config.server.engine_start_timeout_s, stop, config.server.api_key):
            if failure:
                log(f"specserve: deployment failed: {failure[0]}")
                return 1
            if stop.is_set():
                return 130
            log(f"specserve: endpoint {endpoint} did not answer within {config.server.engine_start_timeout_s:.0f} s")
            return 1
        log(f"specserve: ready in {time.monotonic() - started:.1f} s")
        log(f"endpoint: {endpoint}")
        if not joined:
            log(f"metrics: http://{_client_host(config.server.host)}:{config.server.metrics_port}/metrics")
        if prometheus is not None:
            log(f"prometheus: {prometheus.url}")
        stop.wait()
        log("specserve: shutting down")
    return 0


def _serve_mode(config: ServeConfig) -> None:
    """Ray Serve's throughput-optimized mode and its HAProxy ingress: Serve reads both variables when its modules
    load, in every process of the cluster, so they go into this process's environment, which a local cluster's
    processes inherit."""
    wanted = {key: env for key, env in SERVE_SWITCHES.items() if getattr(config.server, key)}
    if not wanted:
        return
    if os.environ.get("RAY_ADDRESS"):
        for key, env in wanted.items():
            log(
                f"specserve: {key} ignored: joining the cluster at RAY_ADDRESS, whose Serve mode comes "
                f"from the environment its nodes started with ({env}=1 ray start ...)"
            )
        return
    for key, env in wanted.items():
        if "ray.serve" in sys.modules and os.environ.get(env) != "1":
            raise RuntimeError(f"{key}: Ray Serve was loaded in this process before the mode was set")
    for env in wanted.values():
        os.environ[env] = "1"


def _start_ray(config: ServeConfig, resolved: ResolvedServe) -> bool:
    """Join RAY_ADDRESS's cluster, or start a local one sized to this machine; True if joined."""
    import ray

    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], runtime_env={"env_vars": resolved.env_vars})
        if config.cpu.engine_cpus is not None:
            log(
                f"specserve: engine_cpus {config.cpu.engine_cpus}: each engine moves there; the cluster's own "
                "processes keep the cores their nodes started with (taskset -c CORES ray start ...)"
            )
        return True
    ray.init(
        # "local": always a new cluster, even where `ray start` left its address behind.
        address="local",
        num_cpus=config.server.num_cpus
        or max(os.cpu_count() or 1, config.num_replicas * config.tensor_parallel_size + 1),
        include_dashboard=False,
        _metrics_export_port=config.server.metrics_port,
    )
    return False


def _keep_serving_off_engine_cores(config: ServeConfig) -> None:
    """With ``engine_cpus``, this process moves to the other cores before it starts the local cluster, whose
    processes (Ray's, Serve's proxy and replicas, Prometheus) inherit them; each replica then moves its engine
    onto ``engine_cpus`` (``replicas/serve/server.py``)."""
    if config.cpu.engine_cpus is None:
        return
    if config.num_replicas > 1:
        raise ConfigError(
            f"engine_cpus {config.cpu.engine_cpus!r} with {config.num_replicas} replicas would put them all "
            "on the same cores of this machine; serve one replica, or leave engine_cpus unset"
        )
    try:
        engine, serving = split_cores(config.cpu.engine_cpus)
    except ValueError as e:
        raise ConfigError(f"engine_cpus {e}") from None
    os.sched_setaffinity(0, serving)
    log(f"specserve: the engine on cores {spans(engine)}; Ray, Serve and Prometheus on {spans(serving)}")


def _require_capacity(config: ServeConfig, on_gpu: bool, joined: bool) -> None:
    """Fail fast where the engines' placement bundles cannot fit a local cluster at all: Ray would otherwise wait
    for resources that never come, warning every 30 s. A joined cluster may yet grow (its autoscaler, or nodes
    still joining), so there the shortfall is only said."""
    import ray

    kind = "GPU" if on_gpu else "CPU"
    ranks = _engine_ranks(config)
    have = ray.cluster_resources()
    shortfalls = []
    if ranks > have.get(kind, 0):
        shortfalls.append(
            f"{config.num_replicas} replica(s) x tensor_parallel_size {config.tensor_parallel_size} need "
            f"{ranks} {kind} (one per engine rank); the Ray cluster has {have.get(kind, 0):g}"
            + ("" if on_gpu else " (raise num_cpus, or serve fewer replicas)")
        )
    for name, amount in custom_resources_per_rank(config).items():
        if ranks * amount > have.get(name, 0):
            shortfalls.append(
                f"placement_group_config.bundle_per_worker: {ranks} engine ranks x {name}={amount:g} need "
                f"{ranks * amount:g} {name}; the Ray cluster has {have.get(name, 0):g} "
                "(give nodes some with `ray start --resources`)"
            )
    if shortfalls and not joined:
        raise ConfigError("\n".join(shortfalls))
    for shortfall in shortfalls:
        log(f"specserve: waiting for the cluster to grow: {shortfall}")


def _engine_ranks(config: ServeConfig) -> int:
    return config.num_replicas * config.tensor_parallel_size


def custom_resources_per_rank(config: ServeConfig) -> dict[str, float]:
    """The custom Ray resources each engine rank's placement bundle asks for besides its device."""
    bundle = (config.placement_group_config or {}).get("bundle_per_worker") or {}
    return {name: float(amount) for name, amount in bundle.items() if name not in RAY_BUILTIN_RESOURCES}


# Resources Ray itself accounts for; an engine rank's GPU or CPU comes from Ray Serve LLM's accelerator bundles.
RAY_BUILTIN_RESOURCES = frozenset({"CPU", "GPU", "TPU", "memory", "object_store_memory"})


def _require_free_ports(config: ServeConfig) -> None:
    """Fail fast: Serve's proxy would otherwise retry binding forever and never come up."""
    _require_free_port(config.server.host, config.server.port, "--port")
    if not os.environ.get("RAY_ADDRESS"):
        _require_free_port("127.0.0.1", config.server.metrics_port, "--metrics-port")
        if config.server.prometheus_port is not None:
            _require_free_port(config.server.host, config.server.prometheus_port, "--prometheus-port")


def _require_prometheus(config: ServeConfig) -> None:
    """A local cluster's Prometheus needs the binary; a joined cluster's metrics are not ours to scrape."""
    if config.server.prometheus_port is None:
        return
    if os.environ.get("RAY_ADDRESS"):
        # Not an error: `make serve` asks for one whenever `prometheus` is installed, RAY_ADDRESS or not. The
        # cluster's nodes export on ports `ray start` chose, and its own Prometheus (deploy/prometheus/) scrapes them.
        log(
            f"specserve: --prometheus-port {config.server.prometheus_port} ignored: joining the cluster at "
            "RAY_ADDRESS, whose own Prometheus scrapes its nodes (deploy/prometheus/prometheus.yml)"
        )
        return
    if PrometheusServer.binary() is None:
        raise ConfigError(
            f"--prometheus-port {config.server.prometheus_port}: no `prometheus` binary on PATH; install it "
            f"({INSTALL_HINT}) or leave the flag out"
        )


def _require_free_port(host: str, port: int, flag: str) -> None:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"{flag} {port}: cannot bind {host}:{port} ({exc.strerror})") from None


def _on_stop_signals(stop: threading.Event) -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())


def _deploy(app: object, failure: list[BaseException], stop: threading.Event) -> None:
    from ray import serve

    try:
        # Text logs: Serve's JSON encoding makes vLLM's start-up lines unreadable in a terminal.
        serve.run(app, name=APP_NAME, route_prefix="/", blocking=False, logging_config={"encoding": "TEXT"})
    except BaseException as exc:  # reported by the main thread
        failure.append(exc)
        stop.set()


def _shutdown_serve(joined: bool) -> None:
    from ray import serve

    if joined:
        serve.delete(APP_NAME)  # leave the user's cluster as it was, less our application
    else:
        serve.shutdown()


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def _wait_ready(
    endpoint: str, deployer: threading.Thread, timeout_s: float, stop: threading.Event, api_key: SecretStr | None
) -> bool:
    """True once the deployment finished (engines up) and the ingress lists the model."""
    deadline = time.monotonic() + timeout_s
    headers = {"Authorization": f"Bearer {api_key.get_secret_value()}"} if api_key is not None else {}
    while time.monotonic() < deadline and not stop.is_set():
        if deployer.is_alive():  # the ingress answers /models before the engines are up
            deployer.join(timeout=1.0)
            continue
        try:
            request = urllib.request.Request(f"{endpoint}/models", headers=headers)
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200 and json.load(response).get("data"):
                    return True
        except (urllib.error.URLError, OSError, ValueError):
            pass
        stop.wait(1.0)
    return False


def _write_state(gcs_address: str, endpoint: str) -> None:
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    # Ray 2.60 turns token authentication on for new local clusters; clients must then ask for it.
    state = {
        "ray_address": gcs_address,
        "endpoint": endpoint,
        "pid": os.getpid(),
        "ray_auth_mode": os.environ.get("RAY_AUTH_MODE"),
    }
    path.write_text(json.dumps(state))


def cluster_address() -> str | None:
    """RAY_ADDRESS if set, else the address a running `specserve serve` recorded (setting the
    authentication mode that cluster expects)."""
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    try:
        state = json.loads(state_file().read_text())
    except (OSError, ValueError):
        return None
    if state.get("ray_auth_mode") and "RAY_AUTH_MODE" not in os.environ:
        os.environ["RAY_AUTH_MODE"] = state["ray_auth_mode"]
    return state.get("ray_address")

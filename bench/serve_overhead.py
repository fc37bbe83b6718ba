"""What the whole specserve path costs against vLLM's bare ``AsyncLLM`` at the same k.

    PYTHONPATH=$PWD .venv/bin/python bench/serve_overhead.py --config bench/configs/perf-S.yaml \
        [--k 2] [--concurrency 1,4,16] [--num-requests 32] [--rounds 3] [--out FILE] \
        [--ways bare,uni,uni1,fast,mp,uni8,fast8,fast8h,vllm] [--ways bare,uni8,bare@KMP_BLOCKTIME=200,...] \
        [--bare-executor mp|uni] [--pin-engine CORES] [--ways bare,uni,uni:pinned] [--step-log DIR]

Ways to serve the same pair at the same fixed k:

- ``bare``: vLLM's ``AsyncLLM`` in this process with the draft model at ``num_speculative_tokens = k``: no
  specserve scheduler, worker extension or policy, no HTTP, no Ray. Requests go straight to ``generate``. Its
  executor is vLLM's CPU default, ``mp``, unless ``--bare-executor uni`` puts the worker inside the EngineCore
  as the ``uni`` ways do.
- ``uni`` / ``mp``: ``specserve serve --config CONFIG --policy fixed:k=K --max-k K`` in its own session
  (stopped by its PID with SIGINT), loaded by ``specserve bench run``'s closed loop over HTTP (run in this
  process): Ray Serve's proxy and OpenAI ingress, the replica, our scheduler and policy, streaming. ``uni`` and
  ``mp`` are the two ``cpu.executor`` settings (``specserve/replicas/serve/engine.py``): the worker inside the
  EngineCore process, or in a process of its own. ``uni1``: ``uni`` with ``cpu.threads: 1``, the one OpenMP
  thread Ray gives a replica that reserves no CPU, against the config's own ``cpu.threads``. ``fast``: ``uni``
  with ``server.throughput_optimized: true``, Ray Serve's throughput-optimized mode (gRPC between deployments,
  requests served by the ingress replica itself, Serve's code on the replica's own event loop). ``uni8`` /
  ``fast8``: ``uni`` / ``fast`` with ``engine_kwargs.stream_interval: 8``, vLLM's stream interval: one streamed
  chunk per 8 output tokens
  (the first and the last at once) instead of one per engine step, through every hop (``bare`` keeps 1: its
  in-process outputs cost little per chunk, so the ratio is, if anything, against the served way). ``fast8h``:
  ``fast8`` with ``server.haproxy: true``, HAProxy in place of Serve's Python HTTP proxy. ``cores``: ``uni`` with
  ``cpu.engine_cpus`` set to the ``--pin-engine`` cores (one OpenMP thread per core): specserve places its own
  processes, the engine on those cores and the local cluster on the rest; the load generator moves off them.
- ``engine``: as ``bare`` (in this process, no HTTP, no Ray, its executor ``--bare-executor``), but with
  specserve's scheduler, worker extension and policy at fixed k: the served engine without the serving path.
  Each served way's ratio to it is the path's cost alone (``over_engine_tokens_per_s``), its own ratio to bare
  the engine's difference.
- ``vllm``: vLLM's own OpenAI server (``vllm.entrypoints.openai.api_server``) with the same engine arguments
  as ``bare``, loaded the same way over HTTP: what HTTP and vLLM's OpenAI layer cost without Ray Serve.
- ``WAY@KEY=VALUE[+KEY=VALUE...]``: any way with those environment variables in its engine's environment, for
  settings that are not config keys (OpenMP's, for one). Its ratio is to ``bare`` with the same variables when
  that runs too, else to ``bare``.

Both get the same closed-loop load: the same prompts in the same order (``bench.prompts.Prompter`` with one
seed per load), greedy, ``ignore_eos``. Before commit 4503589 the in-process ways sent one prompt
``--num-requests`` times (a fresh ``Prompter`` per prompt), so their ratios to the served ways compared
different token streams: at 4 clients on perf pair S 0.20 of the drafts accepted against 0.47 (``--step-log``
showed it).
Each round starts each way once, the order alternating between rounds; the JSON gives output
tokens/s and mean end-to-end latency per way and concurrency, each served way's paired ratio to bare, and the
CPU time per output token of every process involved, by role (``lab.instruments.cpu_share``).
On a machine with few cores the client, Ray's processes and the engine share them, so the ratio there is an
upper bound on the overhead a GPU node with spare cores would see. ``--pin-engine CORES`` measures that node
instead: once each way's engine has started, every thread of its engine processes is pinned to CORES (one
OpenMP thread per core: ``cpu.threads`` for the served ways, ``OMP_NUM_THREADS`` for bare) and every other
process of the way, the load generator included, to the remaining cores; the JSON records the cores each role
held after the load. Where some ways are marked ``:pinned`` (``uni:pinned``, ``bare:pinned``) only those are
pinned, so that one invocation compares a way with its engine's cores its own against the same way on shared
cores, within rounds (``pinned_over_shared_tokens_per_s``): what a CPU node gains by keeping its serving
processes off the model's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

from lab.experiments.report_io import emit_report
from lab.instruments.cpu_share import CpuTally, cores_by_role, pin_engine
from specserve.bench.stats import spread
from specserve.replicas.config.cpu_affinity import set_cores, spans, split_cores

ROOT = Path(__file__).resolve().parents[1]


# The config keys (dotted: section.key) each `specserve serve` way sets in the config it is given; `vllm` is vLLM's
# own server.
UNI = {"cpu.executor": "uni"}
FAST = {**UNI, "server.throughput_optimized": True}
CHUNKS_OF_8 = {"engine_kwargs.stream_interval": 8}
SPECSERVE_WAYS = {
    "uni": UNI,
    "uni1": {**UNI, "cpu.threads": 1},
    "fast": FAST,
    "mp": {"cpu.executor": "mp"},
    "uni8": {**UNI, **CHUNKS_OF_8},
    "fast8": {**FAST, **CHUNKS_OF_8},
    "fast8h": {**FAST, **CHUNKS_OF_8, "server.haproxy": True},
    "cores": UNI,  # with cpu.engine_cpus: the --pin-engine cores (below)
}
SERVED_WAYS = (*SPECSERVE_WAYS, "vllm")
# In this process, as bare, but with specserve's scheduler, worker extension and policy: served ÷ engine is the
# path's cost alone, engine ÷ bare the engine's own difference.
IN_PROCESS_WAYS = ("bare", "engine")


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def parse_cores(text: str) -> set[int]:
    """``0`` or ``0,2-3`` -> {0} or {0, 2, 3}; only cores this process may run on, and not all of them."""
    try:
        return split_cores(text)[0]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class Pinning:
    """``--pin-engine``: the engine's threads on its cores, everything else of a way on the rest, this process
    back on every core between ways (so the next way starts as it would unpinned). ``by_server``: the server
    placed its own processes (``engine_cpus``); this process, the load generator, only moves off the engine's."""

    def __init__(self, engine_cores: set[int] | None, by_server: bool = False) -> None:
        self.engine_cores = engine_cores
        self.by_server = by_server
        self.all_cores = os.sched_getaffinity(0)

    def apply(self, root_pid: int) -> None:
        if self.engine_cores and self.by_server:
            set_cores(psutil.Process(), self.all_cores - self.engine_cores)
        elif self.engine_cores:
            pin_engine(root_pid, self.engine_cores, self.all_cores - self.engine_cores, extra=(os.getpid(),))

    def held(self, root_pid: int) -> dict[str, list[int]]:
        return cores_by_role(root_pid, extra=(os.getpid(),)) if self.engine_cores else {}

    def release(self) -> None:
        if self.engine_cores:
            set_cores(psutil.Process(), self.all_cores)


def step_summary(path: str | None, windows: dict[int, tuple[float, float]], results: dict[int, dict]) -> None:
    """With ``--step-log``: each load's steps (the engine stamps them with the machine-wide monotonic clock, so a
    window taken here selects them), as ``results[c]["steps"]``: what token streams the way's engine ran."""
    if path is None or not Path(path).exists():
        return
    records = [json.loads(line)["record"] for line in Path(path).read_text().splitlines() if line]
    for c, (start, end) in windows.items():
        steps = [r for r in records if start <= r["now_s"] <= end]
        drafted = sum(sum(r["num_drafted_per_request"]) for r in steps)
        accepted = sum(sum(r["num_accepted_per_request"]) for r in steps)
        results[c]["steps"] = {
            "steps": len(steps),
            "drafted": drafted,
            "accepted": accepted,
            "acceptance": round(accepted / drafted, 4) if drafted else None,
            "tokens_per_step": round(sum(r["num_emitted_tokens"] for r in steps) / len(steps), 3) if steps else None,
            "ms_per_step": round(1e3 * sum(r["duration_s"] for r in steps) / len(steps), 2) if steps else None,
        }


def parse_env(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    return key, value


def bare_kwargs(config: dict[str, Any], k: int, specserve: bool = False, step_log: str | None = None) -> dict[str, Any]:
    from specserve.cluster.app import CPU_ENGINE_DEFAULTS
    from specserve.replicas.config.engine_args import EngineSpec, plain_vllm_kwargs, speculative_engine_kwargs

    # The served ways' CPU engine: the config's engine_kwargs over specserve's CPU defaults; so must the engines
    # they are compared with be (sizes and dtype).
    engine = {**CPU_ENGINE_DEFAULTS, **config.get("engine_kwargs", {})}
    spec = EngineSpec(
        target=str(ROOT / config["model_loading_config"]["model_source"]),
        draft=str(ROOT / config["speculation"]["draft"]),
        policy=f"fixed:k={k}",
        max_k=k,
        step_log=step_log,
        max_num_seqs=int(engine["max_num_seqs"]),
        max_model_len=int(engine["max_model_len"]),
        dtype=str(engine["dtype"]),
    )
    return speculative_engine_kwargs(spec) if specserve else plain_vllm_kwargs(spec, speculative=True)


def kv_cache_space_gib(config: dict[str, Any]) -> int:
    from specserve.cluster.sections import CpuEngine

    return CpuEngine(**config.get("cpu", {})).kv_cache_space_gib


def served_config(config: dict[str, Any], keys: dict[str, Any]) -> dict[str, Any]:
    """``config`` with its model folders made absolute (the server runs from ROOT) and ``keys`` (dotted) set."""
    from specserve.cluster.config import set_dotted

    served = copy.deepcopy(config)
    for dotted in ("model_loading_config.model_source", "speculation.draft"):
        section, key = dotted.split(".")
        if served.get(section, {}).get(key):
            served[section][key] = str(ROOT / served[section][key])
    for dotted, value in keys.items():
        set_dotted(served, dotted, value)
    return served


async def closed_loop(engine: Any, prompts: list[str], concurrency: int, max_tokens: int) -> dict[str, float]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    queue = list(enumerate(prompts))
    tokens, e2e = [], []

    async def client() -> None:
        while queue:
            index, prompt = queue.pop(0)
            sent = time.perf_counter()
            count = 0
            async for output in engine.generate(prompt, params, request_id=f"bench-{time.time_ns()}-{index}"):
                count = len(output.outputs[0].token_ids)  # cumulative: the last output holds them all
            e2e.append(time.perf_counter() - sent)
            tokens.append(count)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return {
        "output_tokens_per_s": sum(tokens) / elapsed,
        "mean_e2e_ms": 1e3 * statistics.mean(e2e),
        "output_tokens": sum(tokens),
    }


def run_bare(config: dict[str, Any], args: argparse.Namespace, specserve: bool = False) -> dict[int, dict[str, float]]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from specserve.bench.prompts import Prompter
    from specserve.replicas.config import engine_env

    results: dict[int, dict[str, float]] = {}
    windows: dict[int, tuple[float, float]] = {}
    env = engine_env.engine_env(
        tempfile.mkdtemp(prefix="specserve-overhead-"),
        num_cpus=args.num_cpus,
        kv_cache_space_gib=kv_cache_space_gib(config),
    )
    threads = {"OMP_NUM_THREADS": str(len(args.pin_engine))} if args.pin_engine else {}
    pinning = Pinning(args.pin_engine)
    with engine_env.applied({**env, **threads, **args.engine_env}):
        engine_args = AsyncEngineArgs(**bare_kwargs(config, args.k, specserve, args.step_log_file))
        vllm_config = engine_args.create_engine_config()
        # vLLM's CPU platform turns a requested `uni` into `mp`; set after it, as the served `uni` ways' engine does.
        vllm_config.parallel_config.distributed_executor_backend = args.bare_executor
        engine = AsyncLLM.from_vllm_config(vllm_config, disable_log_stats=engine_args.disable_log_stats)
        pinning.apply(os.getpid())
        try:

            async def all_points() -> None:
                # One Prompter per load, as ServedLoad's runner takes one: the same texts in the same order.
                warm = Prompter(args.seed).prompts(args.warmup, args.input_len)
                await closed_loop(engine, warm, max(args.concurrency), args.output_len)
                for c in args.concurrency:
                    prompts = Prompter(args.seed + c).prompts(args.num_requests, args.input_len)
                    tally = CpuTally(os.getpid(), root_role="load generator + AsyncLLM front end")
                    tally.start()
                    started = time.monotonic()
                    results[c] = await closed_loop(engine, prompts, c, args.output_len)
                    windows[c] = (started, time.monotonic())
                    tally.stop()
                    results[c]["cpu"] = tally.report(int(results[c].pop("output_tokens")))
                    results[c]["cores_by_role"] = pinning.held(os.getpid())
                    name = "engine" if specserve else "bare"
                    print(f"{name} {args.engine_env} c={c}: {results[c]}", file=sys.stderr, flush=True)

            asyncio.run(all_points())
        finally:
            engine.shutdown()
            pinning.release()
    step_summary(args.step_log_file, windows, results)
    return results


def run_served(config: dict[str, Any], way: str, args: argparse.Namespace) -> dict[int, dict[str, float]]:
    """``uni`` / ``mp``: ``specserve serve`` with that executor; ``vllm``: vLLM's own OpenAI server, no Ray."""
    env = None
    if way == "vllm":
        from specserve.replicas.config import engine_env

        kwargs = bare_kwargs(config, args.k)
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", kwargs["model"],
            "--served-model-name", str(config["model_loading_config"].get("model_id", "model")),
            "--port", str(args.port),
            "--dtype", kwargs["dtype"], "--max-model-len", str(kwargs["max_model_len"]),
            "--max-num-seqs", str(kwargs["max_num_seqs"]), "--enforce-eager",
            "--speculative-config", json.dumps(kwargs["speculative_config"]),
        ]  # fmt: skip
        scratch = tempfile.mkdtemp(prefix="specserve-overhead-vllm-")
        env = engine_env.engine_env(scratch, num_cpus=args.num_cpus, kv_cache_space_gib=kv_cache_space_gib(config))
        if args.pin_engine:
            env["OMP_NUM_THREADS"] = str(len(args.pin_engine))
        url = f"http://127.0.0.1:{args.port}/v1"
    else:
        config_path = Path(tempfile.mktemp(prefix="specserve-overhead-", suffix=".yaml"))
        extra: dict[str, Any] = {"cpu.threads": len(args.pin_engine)} if args.pin_engine else {}
        if args.engine_cpus:
            # The config's own cpu.threads would otherwise win over engine_cpus's one thread per core.
            extra |= {"cpu.engine_cpus": spans(args.engine_cpus), "cpu.threads": len(args.engine_cpus)}
        if args.step_log_file:
            extra["speculation.step_log"] = args.step_log_file
        config_path.write_text(yaml.safe_dump(served_config(config, {**SPECSERVE_WAYS[way], **extra})))
        cmd = [
            sys.executable, "-m", "specserve.cluster.cli", "serve", "--config", str(config_path),
            "--policy", f"fixed:k={args.k}", "--max-k", str(max(args.k, 1)), "--port", str(args.port),
        ]  # fmt: skip
        url = None
    log = open(tempfile.mktemp(prefix=f"specserve-overhead-{way}-", suffix=".log"), "w")
    env = {**os.environ, **(env or {}), **args.engine_env}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT, env=env)
    results: dict[int, dict[str, float]] = {}
    windows: dict[int, tuple[float, float]] = {}
    pinning = Pinning(args.engine_cpus, by_server=True) if args.engine_cpus else Pinning(args.pin_engine)
    try:
        url = wait_for_endpoint(Path(log.name), proc, url, timeout_s=600)
        pinning.apply(proc.pid)
        load = ServedLoad(url, args)
        load.run(max(args.concurrency), args.warmup, args.seed)
        root_role = "vLLM API server" if way == "vllm" else "specserve serve driver"
        for c in args.concurrency:
            # This process is the load generator: its CPU counts beside the server's processes.
            tally = CpuTally(proc.pid, root_role=root_role, extra={os.getpid(): "load generator"})
            tally.start()
            started = time.monotonic()
            report = load.run(c, args.num_requests, args.seed + c)
            windows[c] = (started, time.monotonic())
            tally.stop()
            tokens = report["throughput"]["output_tokens_per_s"] * report["duration_s"]
            results[c] = {
                "output_tokens_per_s": report["throughput"]["output_tokens_per_s"],
                "mean_e2e_ms": report["e2e_ms"]["mean"],
                "cpu": tally.report(round(tokens)),
                "cores_by_role": pinning.held(proc.pid),
            }
            print(f"{way} {args.engine_env} c={c}: {results[c]}", file=sys.stderr, flush=True)
    finally:
        stop_server(proc)
        log.close()
        pinning.release()
    step_summary(args.step_log_file, windows, results)
    return results


class ServedLoad:
    """``specserve bench run``'s closed loop, in this process, so that a CPU tally brackets the load alone."""

    def __init__(self, url: str, args: argparse.Namespace) -> None:
        from specserve.bench import client
        from specserve.bench.cli import base_url

        self.args = args
        url = base_url(url)
        model = asyncio.run(client.first_model(url, 60.0))
        target = client.Target(url, model, "completions", True, 0.0, 300.0)
        ignore_eos, note = asyncio.run(client.probe(target))
        if not ignore_eos:
            raise RuntimeError(f"the server does not take ignore_eos: {note}")
        self.target = target

    def run(self, concurrency: int, num_requests: int, seed: int) -> dict[str, Any]:
        from specserve.bench import client, report
        from specserve.bench.load import Lengths, closed_plan
        from specserve.bench.prompts import Prompter

        args = self.args
        plan = closed_plan(concurrency, Lengths(args.input_len, args.output_len), num_requests, None)
        runner = client.Runner(self.target, Prompter(seed), progress=False)
        outcomes, duration_s = asyncio.run(runner.run(plan))
        result = report.summarize(outcomes, duration_s, {})
        if result["requests"]["failed"]:
            raise RuntimeError(f"{result['requests']['failed']} requests failed: {result.get('errors')}")
        return result


def stop_server(proc: subprocess.Popen) -> None:
    """Ctrl-C, as an operator would; its whole session (started with start_new_session) killed if it hangs."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_for_endpoint(log_path: Path, proc: subprocess.Popen, url: str | None, timeout_s: float) -> str:
    """The URL once the server answers: ``specserve serve`` prints its ``endpoint:`` line; vLLM's server is
    polled at ``url``/models."""
    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if url is None:
            for line in log_path.read_text().splitlines():
                if line.startswith("endpoint: "):
                    return line.split()[1]
        else:
            try:
                if requests.get(f"{url}/models", timeout=2).ok:
                    return url
            except requests.RequestException:
                pass
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:4]} exited with {proc.returncode}; log: {log_path}")
        time.sleep(1.0)
    raise TimeoutError(f"no endpoint after {timeout_s} s; log: {log_path}")


PINNED = ":pinned"


def split_way(way: str) -> tuple[str, dict[str, str]]:
    """``uni8@KMP_BLOCKTIME=1+OMP_X=2:pinned`` -> ("uni8", {"KMP_BLOCKTIME": "1", "OMP_X": "2"})."""
    name, _, variables = way.removesuffix(PINNED).partition("@")
    return name, dict(parse_env(item) for item in variables.split("+")) if variables else {}


def is_pinned(way: str, ways: list[str], pin_engine: set[int] | None) -> bool:
    """With ``--pin-engine``, the ways marked ``:pinned``, or every way where none is marked (``cores`` places
    its processes itself)."""
    if not pin_engine or split_way(way)[0] == "cores":
        return False
    return way.endswith(PINNED) or not any(w.endswith(PINNED) or split_way(w)[0] == "cores" for w in ways)


def shared_twin(way: str) -> str:
    """The way a pinned one is compared with on shared cores: ``uni:pinned`` -> ``uni``, ``cores`` -> ``uni``."""
    if split_way(way)[0] == "cores":
        return "uni" + way.removeprefix("cores")
    return way.removesuffix(PINNED) if way.endswith(PINNED) else ""


def bare_of(way: str, ways: list[str]) -> str:
    """The bare way a served way is compared with: bare with the same environment and pinning if it runs, else
    bare."""
    twin = "bare" + way[len(split_way(way)[0]) :]
    return twin if twin != "bare" and twin in ways else "bare"


def ratios(
    rounds: list[dict[str, Any]], way: str, bare: str, concurrency: list[int], metric: str
) -> dict[str, dict[str, float]]:
    """Per concurrency, ``way`` / ``bare`` of ``metric`` taken within each round."""
    return {str(c): spread([r[way][c][metric] / r[bare][c][metric] for r in rounds]) for c in concurrency}


def cpu_by_role(rounds: list[dict[str, Any]], way: str, concurrency: int) -> dict[str, float]:
    points = [r[way][concurrency]["cpu"]["cpu_ms_per_output_token"] for r in rounds]
    roles = sorted({role for point in points for role in point})
    return {role: round(statistics.median(point.get(role, 0.0) for point in points), 3) for role in roles}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=ROOT / "bench/configs/perf-S.yaml")
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--concurrency", type=parse_ints, default=[1, 4, 16])
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--port", type=int, default=8010)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--ways", default="bare,uni,mp", help=f"bare and any of the served ways {', '.join(SERVED_WAYS)}"
    )
    parser.add_argument(
        "--engine-env",
        action="append",
        type=parse_env,
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable for every way's engine (bare's in this process, a served way's whole server)",
    )
    parser.add_argument(
        "--bare-executor",
        choices=("mp", "uni"),
        default="mp",
        help="bare's executor: vLLM's default on CPU, mp (the worker in a process of its own, which the EngineCore "
        "waits on), or uni (the worker inside the EngineCore, as the served ways but mp run it)",
    )
    parser.add_argument(
        "--pin-engine",
        type=parse_cores,
        metavar="CORES",
        help="the engine's threads on these cores (0 or 0,2-3), every other process on the rest: a GPU node's split; "
        f"for every way, or only those marked {PINNED} (uni{PINNED}, bare{PINNED}) where some are",
    )
    parser.add_argument(
        "--step-log",
        type=Path,
        metavar="DIR",
        help="specserve's engines (engine and the specserve serve ways) log every step to DIR/WAY-rROUND.jsonl; the "
        "JSON gains each load's drafts accepted, tokens and ms a step: did the ways run the same token streams?",
    )
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    args.engine_env = dict(args.engine_env)
    if args.step_log:
        args.step_log = args.step_log.resolve()
        args.step_log.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load(args.config.read_text())

    ways = args.ways.split(",")
    try:
        parsed = {way: split_way(way) for way in ways}
    except argparse.ArgumentTypeError as e:
        parser.error(f"--ways {args.ways!r}: {e}")
    if (
        "bare" not in ways
        or len(ways) < 2
        or not {name for name, _ in parsed.values()} <= {*IN_PROCESS_WAYS, *SERVED_WAYS}
    ):
        parser.error(
            f"--ways {args.ways!r}: bare and at least one of engine, {', '.join(SERVED_WAYS)}, each with @KEY=VALUE"
        )
    if any(way.endswith(PINNED) or parsed[way][0] == "cores" for way in ways) and not args.pin_engine:
        parser.error(f"--ways {args.ways!r}: cores and ways marked {PINNED} need --pin-engine CORES")
    served = [way for way in ways if parsed[way][0] != "bare"]
    rounds = []
    for r in range(args.rounds):
        order = ways[r % len(ways) :] + ways[: r % len(ways)]  # rotate, so drift hits every way alike
        result = {}
        for way in order:
            name, variables = parsed[way]
            step_log = str(args.step_log / f"{way}-r{r}.jsonl") if args.step_log else None
            way_args = argparse.Namespace(
                **{
                    **vars(args),
                    "engine_env": {**args.engine_env, **variables},
                    "step_log_file": step_log,
                    "pin_engine": args.pin_engine if is_pinned(way, ways, args.pin_engine) else None,
                    "engine_cpus": args.pin_engine if name == "cores" else None,
                }
            )
            if name in IN_PROCESS_WAYS:
                result[way] = run_bare(config, way_args, specserve=name == "engine")
            else:
                result[way] = run_served(config, name, way_args)
        rounds.append(result)

    report = {
        "what": "specserve serve over HTTP against vLLM's bare AsyncLLM in-process, same pair and fixed k",
        "config": str(args.config.relative_to(ROOT) if args.config.is_absolute() else args.config),
        "k": args.k,
        "load": {"input_len": args.input_len, "output_len": args.output_len, "num_requests": args.num_requests},
        "rounds": args.rounds,
        "engine_env": args.engine_env,
        "pin_engine": sorted(args.pin_engine) if args.pin_engine else None,
        "pinned_ways": [way for way in ways if is_pinned(way, ways, args.pin_engine)],
        "bare_executor": args.bare_executor,
        "over_bare_tokens_per_s": {
            way: ratios(rounds, way, bare_of(way, ways), args.concurrency, "output_tokens_per_s") for way in served
        },
        "over_bare_mean_e2e": {
            way: ratios(rounds, way, bare_of(way, ways), args.concurrency, "mean_e2e_ms") for way in served
        },
        # With the in-process specserve engine run too: each served way over it, the serving path's cost alone.
        "over_engine_tokens_per_s": {
            way: ratios(rounds, way, "engine", args.concurrency, "output_tokens_per_s")
            for way in served
            if way != "engine" and "engine" in ways
        },
        # A way pinned beside the same way unpinned: what giving the engine cores of its own is worth there.
        "pinned_over_shared_tokens_per_s": {
            way: ratios(rounds, way, shared, args.concurrency, "output_tokens_per_s")
            for way in ways
            if (shared := shared_twin(way)) in ways
        },
        # Ways with environment variables of their own; each is compared with the bare way named here.
        "compared_with": {way: bare_of(way, ways) for way in served},
        "per_round": [{way: {str(c): v for c, v in r[way].items()} for way in r} for r in rounds],
        # CPU milliseconds per output token by role (engine, HTTP proxy, ingress, serve replica, Ray's own
        # processes, the load generator), medians over rounds: who else ran on the engine's cores.
        "cpu_ms_per_output_token": {
            way: {str(c): cpu_by_role(rounds, way, c) for c in args.concurrency} for way in ways
        },
    }
    if args.step_log:
        # Did the ways' engines run the same token streams? Only specserve's engines log steps.
        report["draft_acceptance"] = {
            way: {str(c): [r[way][c]["steps"]["acceptance"] for r in rounds] for c in args.concurrency}
            for way in ways
            if all("steps" in r[way].get(c, {}) for r in rounds for c in args.concurrency)
        }
    emit_report(report, args.out)


if __name__ == "__main__":
    main()

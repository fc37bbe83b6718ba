"""The `specserve` command line.

A command's result goes to stdout: the `status` table or document, `policy set`'s confirmation, the
JSON of `models`. Progress, logs, notes and errors go to stderr, so `specserve status | grep NAME` and
`specserve status --json | jq` see results only.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import itertools
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import yaml

from specserve.cluster import control
from specserve.cluster.control import CommandError
from specserve.cluster.sections import METHODS
from specserve.models.arguments import add_commands as add_model_commands


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    words = sys.argv[1:] if argv is None else argv
    command = " ".join(["specserve", *itertools.takewhile(lambda word: not word.startswith("-"), words)])
    with warnings.catch_warnings():  # the printer below is this command's only
        warnings.showwarning = _config_note_printer(command, warnings.showwarning)
        try:
            return args.run(args)
        except CommandError as exc:
            print(f"specserve {args.command}: {exc}", file=sys.stderr)
            return 2


def _config_note_printer(command: str, shown: Any) -> Any:
    """``specserve.llm.ConfigNote`` warnings as one line naming the command, like the CLI's other messages, once each
    (vLLM's and Ray's imports reset Python's record of warnings shown); every other warning as ``shown`` shows it.
    Matched by name: ``specserve.llm`` is slow to import, and only it warns so."""
    printed: set[str] = set()

    def show(message: Warning | str, category: type[Warning], *where: Any, **kw: Any) -> None:
        if category.__module__ != "specserve.llm" or category.__name__ != "ConfigNote":
            shown(message, category, *where, **kw)
        elif str(message) not in printed:
            printed.add(str(message))
            print(f"{command}: {message}", file=sys.stderr)

    return show


# Placeholders until the project is published: mkdocs.yml's site_url and repo_url (a unit test keeps them equal).
DOCS_URL = "https://specserve.readthedocs.io/en/latest/"
REPO_URL = "https://github.com/specserve/specserve"
# The wheel carries the package only: the cluster files and dashboards are the repository's, so the help says where.
EPILOG = f"""\
docs: {DOCS_URL}
deployment files (ray up, Serve, KubeRay, Prometheus, Grafana) are not installed with the package:
  {REPO_URL}/tree/main/deploy
Grafana dashboards (JSON, and the code that generates them):
  {REPO_URL}/tree/main/dashboards"""


def version() -> str:
    """The installed distribution's version; a source tree run without installing has none."""
    try:
        return importlib.metadata.version("specserve")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specserve",
        description="LLM serving with adaptive speculative decoding.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"specserve {version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser(
        "serve",
        help="run the OpenAI-compatible endpoint in the foreground",
        description="Serve a target with adaptive speculation. The config file is a Ray Serve LLM LLMConfig plus "
        "speculation:, cpu: and server: sections; flags override it. With no model, the bundled tiny pair on CPU.",
    )
    add_config_flags(serve)
    serve.add_argument("--host", help="address the HTTP ingress binds (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, help="HTTP port (default: 8000)")
    serve.add_argument("--metrics-port", dest="metrics_port", type=int, help="Ray metrics export port (default: 8080)")
    serve.add_argument(
        "--prometheus-port",
        dest="prometheus_port",
        type=int,
        help="also run Prometheus on this port, scraping the local cluster (default: none; needs `prometheus`)",
    )
    serve.add_argument(
        "--api-key",
        dest="api_key",
        default=os.environ.get("SPECSERVE_API_KEY") or None,
        help="bearer token the HTTP endpoint requires (default: $SPECSERVE_API_KEY, else none: open); "
        "prefer the variable, which `ps` does not show",
    )
    serve.set_defaults(run=_serve)

    config = commands.add_parser("config", help="show the Serve application a config resolves to")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    render = config_commands.add_parser(
        "render",
        help="print the complete Serve config `serve` would deploy, starting nothing",
        description="Print the Serve config file (`serve deploy` takes it) for the application `specserve serve` "
        "would deploy: every LLMConfig value resolved, on Ray Serve LLM's build_openai_app with specserve's ingress. "
        "The engine path goes to stderr and into a comment. No API key is printed: the ingress reads "
        "SPECSERVE_API_KEY on the head node.",
    )
    add_config_flags(render)
    render.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    render.set_defaults(run=_render)

    from specserve.bench.cli import _positive

    doctor = commands.add_parser(
        "doctor",
        help="run the start-up checks and time steps on this machine, for a config",
        description="Build the engine a replica of the config would run, here (no Ray cluster), run the start-up "
        "checks every replica runs before it serves (k honoured, k = 0 runs no draft pass, draft signals arrive) and "
        "print them with the measured step costs. Exit status 1 when a check fails. With no model: the bundled tiny "
        "pair, as `serve`.",
    )
    add_config_flags(doctor)
    doctor.add_argument(
        "--prompts",
        type=Path,
        help="also decode these prompts at max k and print what speculation pays on them: one a line, or JSON lines "
        'with a "prompt"',
    )
    doctor.add_argument(
        "--max-tokens", type=_positive(int), default=64, help="output tokens per prompt of --prompts (default 64)"
    )
    doctor.set_defaults(run=_doctor)

    status = commands.add_parser("status", help="one row per replica: policy, k, acceptance, load, KV")
    status.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    status.set_defaults(run=_status)

    policy = commands.add_parser("policy", help="switch the speculation policy at run time")
    policy_commands = policy.add_subparsers(dest="policy_command", required=True)
    policy_set = policy_commands.add_parser("set", help="set NAME[:key=value,...] on all replicas or one")
    policy_set.add_argument("spec", help="e.g. fixed:k=2, goodput, adaptive")
    policy_set.add_argument("--replica", help="replica id from `specserve status` (default: all)")
    policy_set.set_defaults(run=_policy_set)

    models = commands.add_parser("models", help="build, fetch or measure local target/draft pairs")
    add_model_commands(models, dest="models_command")
    models.set_defaults(run=_models)

    from specserve.sim import cli as sim_cli  # the simulator's commands; no Ray or vLLM

    sim = commands.add_parser("sim", help="discrete-event serving simulator driving the same policies")
    sim_cli.add_commands(sim, dest="sim_command")
    sim.set_defaults(run=sim_cli.run)

    from specserve.bench import cli as bench_cli  # flags only; the client loads when a run starts

    bench = commands.add_parser("bench", help="load generator for any OpenAI-compatible endpoint")
    backend = bench_cli.PolicyBackend(
        parse=control.parse_policies, canonical=control.canonical_policy, connect=control.PolicySwitch
    )
    bench_commands = bench_cli.add_commands(bench, dest="bench_command", policies=backend)
    _add_controller_bench(bench_commands)
    bench.set_defaults(run=_bench)
    return parser


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """The config file and its shorthands, shared by `serve`, `config render` and `doctor`."""
    parser.add_argument("--config", help="YAML file: an LLMConfig plus speculation, cpu and server sections")
    parser.add_argument(
        "--model", help="target: a Hugging Face id, a folder, or s3:// / gs:// (default: the bundled tiny pair)"
    )
    parser.add_argument("--draft", help="draft model: a Hugging Face id or a folder (with --model)")
    parser.add_argument("--method", choices=METHODS, help="speculative method (default: draft_model)")
    parser.add_argument("--policy", help="speculation policy NAME[:key=value,...] (default: adaptive)")
    parser.add_argument("--max-k", "--k-max", dest="max_k", type=int, help="largest speculation length k (default: 4)")
    parser.add_argument("--replicas", type=int, help="Ray Serve replicas (deployment_config.num_replicas)")
    parser.add_argument(
        "--tp", "--tensor-parallel-size", dest="tp", type=int, help="tensor-parallel size per engine (default: 1)"
    )
    parser.add_argument("--max-model-len", dest="max_model_len", type=int, help="longest prompt + output, tokens")
    parser.add_argument(
        "--engine-arg",
        dest="engine_args",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any vLLM engine argument, repeatable: --engine-arg gpu_memory_utilization=0.9 "
        "--engine-arg kv_cache_dtype=fp8 (VALUE read as YAML: numbers, true/false, {json})",
    )
    parser.add_argument(
        "--device", choices=("gpu", "cpu"), help="where the engines run (default: the config's, else this machine's)"
    )


# Each shorthand flag and the config key it sets.
CONFIG_FLAGS = {
    "model": "model_loading_config.model_source",
    "draft": "speculation.draft",
    "method": "speculation.method",
    "policy": "speculation.policy",
    "max_k": "speculation.max_k",
    "replicas": "deployment_config.num_replicas",
    "tp": "engine_kwargs.tensor_parallel_size",
    "max_model_len": "engine_kwargs.max_model_len",
    "device": "accelerator_config.kind",
    "host": "server.host",
    "port": "server.port",
    "metrics_port": "server.metrics_port",
    "prometheus_port": "server.prometheus_port",
    "api_key": "server.api_key",
}


def config_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The flags as dotted config keys; a malformed --engine-arg is a CommandError naming it."""
    overrides = {key: getattr(args, flag) for flag, key in CONFIG_FLAGS.items() if hasattr(args, flag)}
    for item in args.engine_args:
        key, sep, text = item.partition("=")
        key = key.strip().removeprefix("--").replace("-", "_")
        if not sep or not key.isidentifier():
            raise CommandError(f"--engine-arg {item!r}: expected KEY=VALUE, e.g. gpu_memory_utilization=0.9")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            raise CommandError(f"--engine-arg {item!r}: VALUE is not a YAML or JSON value") from None
        overrides[f"engine_kwargs.{key}"] = value
    return overrides


def load_cli_config(args: argparse.Namespace) -> Any:
    from specserve.cluster.config import ConfigError, load_config

    try:
        return load_config(args.config, config_overrides(args))
    except ConfigError as exc:
        raise CommandError(str(exc)) from None


def _render(args: argparse.Namespace) -> int:
    from specserve.cluster.app import engine_path, resolve_serve, serve_document
    from specserve.cluster.config import ConfigError, note_folders_not_here

    config = load_cli_config(args)
    note_folders_not_here(config, "specserve config render")
    try:
        resolved = resolve_serve(config)
        document = serve_document(resolved)
    except ConfigError as exc:
        raise CommandError(str(exc)) from None
    path = engine_path(resolved.on_gpu)
    print(f"engine path: {path}", file=sys.stderr)
    for name in redact_secrets(document):
        print(
            f"specserve config render: runtime_env.env_vars.{name} not printed; set it in the nodes' environment "
            "(ray start, or the pod's Secret) rather than in a Serve config",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(f"# specserve config render: {path}")
        print(yaml.safe_dump(document, sort_keys=False), end="")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from specserve.cluster import doctor
    from specserve.cluster.config import ConfigError

    # vLLM logs to stdout by default; stdout is for the tables.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    config = load_cli_config(args)
    try:
        return doctor.main(config, args.prompts, args.max_tokens)
    except ConfigError as exc:
        raise CommandError(str(exc)) from None


_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "API_KEY", "ACCESS_KEY")


def redact_secrets(document: dict[str, Any]) -> list[str]:
    """Blank the values of environment variables that look like credentials (HF_TOKEN, AWS_SECRET_ACCESS_KEY, ...)
    in a rendered Serve config, in place; returns their names. A rendered file is meant to be shared and deployed."""
    names = []
    for app in document.get("applications", []):
        for llm in app.get("args", {}).get("llm_configs", []):
            env = (llm.get("runtime_env") or {}).get("env_vars") or {}
            for name in env:
                if any(word in name.upper() for word in _SECRET_WORDS):
                    env[name] = "<not printed>"
                    names.append(name)
    return names


def _add_controller_bench(commands: argparse._SubParsersAction) -> None:
    from specserve.bench.cli import _concurrency_list, _positive

    bench = commands.add_parser(
        "controller", help="the cluster controller under N virtual replicas pushing once a second (local Ray)"
    )
    bench.add_argument("--replicas", type=_concurrency_list, required=True, help="virtual replica counts: N,N,...")
    bench.add_argument("--duration", type=_positive(float), default=20.0, help="seconds of rounds per count (20)")
    bench.add_argument(
        "--batch",
        type=_batch_modes,
        default=["none"],
        help="none: one push per replica (default); node: a node's replicas in one call; both: none,node",
    )
    bench.add_argument("--per-node", type=_positive(int), default=8, help="replicas per virtual node (8)")
    bench.add_argument("--models", type=_positive(int), default=4, help="deployments the replicas serve (4)")
    bench.add_argument("--pushers", type=_positive(int), default=4, help="actors that push for the replicas (4)")
    bench.add_argument("--num-cpus", type=_positive(int), help="CPUs of the local Ray (default: the machine's)")
    bench.add_argument("--seed", type=int, default=0, help="the virtual replicas' snapshots (default 0)")
    bench.add_argument("--out", help="path prefix: writes PREFIX.json and PREFIX.png")
    bench.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    bench.set_defaults(bench_run=_controller_bench)


def _batch_modes(text: str) -> list[str]:
    modes = {"none": ["none"], "node": ["node"], "both": ["none", "node"]}
    if text not in modes:
        raise argparse.ArgumentTypeError(f"{text!r}: choose none, node or both")
    return modes[text]


def _controller_bench(args: argparse.Namespace) -> int:
    from specserve.cluster import controller_bench

    return controller_bench.run(args)


def _bench(args: argparse.Namespace) -> int:
    from specserve.bench import cli as bench_cli

    try:
        return bench_cli.run(args)
    except bench_cli.BenchError as exc:
        raise CommandError(str(exc)) from None


def _serve(args: argparse.Namespace) -> int:
    from specserve.cluster.config import ConfigError
    from specserve.cluster.local import serve_forever

    config = load_cli_config(args)
    try:
        return serve_forever(config)
    except ConfigError as exc:
        raise CommandError(str(exc)) from None


def _status(args: argparse.Namespace) -> int:
    snapshots = control.snapshots(control.controller())
    if args.json:
        # The engine one level deep, under the keys this output has always had (``EngineTelemetry.flat``).
        rows = [
            {"replica_id": s.replica_id, "node_id": s.node_id, "model_id": s.model_id, "engine": s.engine.flat()}
            | {"acceptance": s.engine.acceptance}
            for s in snapshots
        ]
        print(json.dumps({"replicas": rows}, indent=2))
        return 0
    for line in status_table(snapshots):
        print(line)
    if not snapshots:
        print("(no replica has reported yet)", file=sys.stderr)
    return 0


def status_table(snapshots: list[Any]) -> list[str]:
    """One line per replica under a header, columns padded to their widest cell."""
    header = (
        "REPLICA", "NODE", "METHOD", "POLICY", "K", "ACCEPT", "BATCH", "WAIT", "KV USED/TOTAL", "DRAFT", "COLLAPSE",
        "CHECKS",
    )  # fmt: skip
    table = [header]
    for s in snapshots:
        e, load, memory = s.engine, s.engine.load, s.engine.draft_memory
        used = load.num_kv_blocks_total - load.num_kv_blocks_free
        acceptance = "-" if e.acceptance is None else f"{e.acceptance:.2f}"
        # While the draft is offloaded the pool holds its bytes as extra blocks: shown as "+N".
        grown = (
            load.num_kv_blocks_total - memory.baseline_blocks if memory is not None and memory.baseline_blocks else 0
        )
        kv = f"{used}/{load.num_kv_blocks_total}" + (f" (+{grown})" if grown > 0 else "")
        table.append(
            (
                s.replica_id,
                s.node_id[:12],
                e.policy.method,
                e.policy.spec,
                str(e.policy.k),
                acceptance,
                str(load.num_running),
                str(load.num_waiting),
                kv,
                memory.state.value if memory is not None else "none",
                e.collapse.collapse_state.value if e.collapse is not None else "none",
                "failed:" + ",".join(e.failed_checks) if e.failed_checks else "ok",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in table]


def _policy_set(args: argparse.Namespace) -> int:
    _, targets = control.queue_policy(control.controller(), args.spec, args.replica)
    print(f"policy {args.spec} queued for {len(targets)} replica(s): {', '.join(targets) or 'none yet'}")
    return 0


def _models(args: argparse.Namespace) -> int:
    from specserve.models.__main__ import run

    result = run(argparse.Namespace(**{**vars(args), "command": args.models_command}))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

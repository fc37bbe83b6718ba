"""`specserve bench run`: load on any OpenAI-compatible endpoint, one report; `bench compare`: the same
load under several policies of one specserve server (see ``compare``); `bench report`: a comparison's
page and plots again from its JSON.

`run`'s report goes to stdout (one JSON document with ``--json``, a table otherwise); the progress bar and
notes go to stderr. `compare` writes files and names them on stdout; its progress goes to stderr. Bad
input raises BenchError, which the top-level CLI prints as one line with exit status 2. The client
modules (they import vLLM's request functions, which pulls in torch) load only when a run starts, so
``specserve --help`` stays fast.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import secrets
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from specserve.bench.compare import PolicySwitch, log
from specserve.bench.load import (
    BenchError,
    Lengths,
    Phase,
    Plan,
    Segment,
    closed_plan,
    open_plan,
    parse_clients,
    parse_rate,
    schedule_plan,
    trace_plan,
)
from specserve.bench.stats import DEFAULT_RESAMPLES, METRICS
from specserve.bench.workload import WORKLOADS, make_workload

DEFAULT_NUM_REQUESTS = 100
COMPARE_NUM_REQUESTS = 64


@dataclass(frozen=True, slots=True)
class PolicyBackend:
    """What `bench compare` needs from the cluster side, which owns the policy registry and Ray."""

    # --policies text -> the specs as written, checked against the registry without a cluster.
    parse: Callable[[str], list[str]]
    # A spec as the engines report it (``fixed:k=3`` runs as ``fixed``), checked without a cluster.
    canonical: Callable[[str], str]
    # Connects to the running cluster; the argument limits how long one switch may take, s.
    connect: Callable[[float], PolicySwitch]


def _positive(kind: type) -> Any:
    def convert(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0 or (isinstance(value, float) and math.isinf(value)):
            raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
        return value

    return convert


RANGE_RATIO_HELP = "lengths uniform within ±R of --input-len/--output-len, 0 <= R < 1 (default 0: all equal)"


CLIENTS_HELP = "closed loop whose clients change: N:SECONDS,N:SECONDS,... (e.g. 1:20,16:20,1:20)"


def _rate(text: str) -> list[Segment]:
    try:
        return parse_rate(text)
    except BenchError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _clients(text: str) -> list[Phase]:
    try:
        return parse_clients(text)
    except BenchError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _concurrency_list(text: str) -> list[int]:
    values = []
    for part in text.split(","):
        try:
            value = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: {part!r} is not a whole number") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: {part!r} must be at least 1")
        if value in values:
            raise argparse.ArgumentTypeError(f"{text!r}: {value} appears twice")
        values.append(value)
    return values


def _rounds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: need at least 1 round")
    return value


def add_commands(
    parser: argparse.ArgumentParser, dest: str, policies: PolicyBackend | None = None
) -> argparse._SubParsersAction:
    """The bench commands under ``parser``; `compare` only with a ``policies`` backend to switch policies. Returns
    the subcommands, for the cluster side's own (`bench controller` needs Ray, which this package never imports)."""
    commands = parser.add_subparsers(dest=dest, required=True)
    run = commands.add_parser("run", help="send load, report throughput, latency percentiles, goodput, errors")
    run.add_argument("--url", required=True, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    run.add_argument("--model", help="model name to request (default: the first one GET /models lists)")
    run.add_argument("--api", choices=("completions", "chat"), default="completions", help="default: completions")
    load = run.add_mutually_exclusive_group(required=True)
    load.add_argument("--concurrency", type=_positive(int), help="closed loop: N clients, next request on answer")
    load.add_argument("--clients", type=_clients, help=CLIENTS_HELP)
    load.add_argument("--rate", type=_rate, help="open loop: QPS, or piecewise QPS:SECONDS,QPS:SECONDS,...")
    load.add_argument("--trace", help="replay a simulator trace: a built-in name or a CSV path")
    stop = run.add_mutually_exclusive_group()
    stop.add_argument("--duration", type=_positive(float), help="seconds in which requests are sent")
    stop.add_argument("--num-requests", type=_positive(int), help=f"requests to send (default {DEFAULT_NUM_REQUESTS})")
    run.add_argument("--burstiness", type=_positive(float), default=1.0, help="gamma shape of gaps (1: Poisson)")
    run.add_argument("--trace-speed", type=_positive(float), default=1.0, help="replay N times faster (default 1)")
    run.add_argument("--input-len", type=_positive(int), default=128, help="prompt tokens (not with --trace)")
    run.add_argument("--output-len", type=_positive(int), default=64, help="max_tokens (not with --trace)")
    run.add_argument("--range-ratio", type=float, default=0.0, help=RANGE_RATIO_HELP)
    run.add_argument("--tokenizer", help="tokenizer folder: exact prompt lengths (default: words, about 1 each)")
    run.add_argument("--temperature", type=float, default=0.0, help="default: 0")
    run.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false", help="let requests stop at EOS")
    run.add_argument("--timeout", type=_positive(float), default=300.0, help="per-request limit, s (default 300)")
    run.add_argument("--seed", type=int, default=0, help="arrival times and prompts (default 0)")
    run.add_argument(
        "--workload", choices=WORKLOADS, default="random", help="random words (default), or mixed: copy and free-form"
    )
    run.add_argument("--copy-share", type=float, help="mixed: share of copy-heavy requests, 0-1 (default 0.5)")
    run.add_argument("--metrics-url", help="the server's Prometheus page: its speculative acceptance over the run")
    for name in ("ttft", "tpot", "e2e"):
        run.add_argument(f"--slo-{name}-ms", type=_positive(float), help=f"goodput: {name.upper()} limit, ms")
    run.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    run.add_argument("--per-request", action="store_true", help="add one row per request to the JSON")
    run.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar on stderr")
    run.set_defaults(bench_run=run_load)
    if policies is not None:
        _add_compare(commands, policies)
    report = commands.add_parser(
        "report", help="a `bench compare` page and plots again, from its JSON; or one page from several"
    )
    report.add_argument(
        "results",
        nargs="+",
        help="the PREFIX.json that `bench compare` wrote; several (one per load, each with its own policies) "
        "make one page with every load, each point's rounds paired only with each other (needs --out)",
    )
    report.add_argument("--out", help="path prefix of the page and plots (default: the JSON's own)")
    report.add_argument("--metric", choices=sorted(METRICS), help="headline metric (default: the run's)")
    report.set_defaults(bench_run=run_report)
    return commands


def _add_compare(commands: argparse._SubParsersAction, policies: PolicyBackend) -> None:
    compare = commands.add_parser(
        "compare", help="the same load under each policy on one specserve server, interleaved rounds, ratios with CIs"
    )
    compare.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000/v1")
    compare.add_argument("--policies", required=True, help="e.g. fixed:k=0,fixed:k=2,static-table,adaptive")
    load = compare.add_mutually_exclusive_group(required=True)
    load.add_argument("--concurrency", type=_concurrency_list, help="closed loop at each of N,N,... clients")
    load.add_argument("--clients", type=_clients, help=CLIENTS_HELP)
    load.add_argument("--trace", help="replay a simulator trace: a built-in name or a CSV path")
    compare.add_argument("--rounds", type=_rounds, default=5, help="interleaved rounds per load point (default 5)")
    compare.add_argument(
        "--max-rounds", type=_rounds, help="keep adding rounds, up to this many, until the headline CI settles"
    )
    compare.add_argument(
        "--ci-width", type=_positive(float), default=0.05, help="settled: CI excludes 1 or is narrower (0.05)"
    )
    compare.add_argument("--headline", help="policy whose CI decides --max-rounds (default: adaptive)")
    compare.add_argument("--metric", choices=sorted(METRICS), help="headline metric (default: tok_s; e2e for --trace)")
    stop = compare.add_mutually_exclusive_group()
    stop.add_argument("--num-requests", type=_positive(int), help=f"per run (default {COMPARE_NUM_REQUESTS})")
    stop.add_argument("--duration", type=_positive(float), help="seconds per run in which requests are sent")
    compare.add_argument("--trace-speed", type=_positive(float), default=1.0, help="replay N times faster")
    compare.add_argument("--input-len", type=_positive(int), default=128, help="prompt tokens (not with --trace)")
    compare.add_argument("--output-len", type=_positive(int), default=64, help="max_tokens (not with --trace)")
    compare.add_argument("--range-ratio", type=float, default=0.0, help=RANGE_RATIO_HELP)
    compare.add_argument("--warmup", type=int, default=16, help="unrecorded requests before the first run (16)")
    compare.add_argument("--model", help="model name to request (default: the first one GET /models lists)")
    compare.add_argument("--api", choices=("completions", "chat"), default="completions", help="default: completions")
    compare.add_argument("--tokenizer", help="tokenizer folder: exact prompt lengths")
    compare.add_argument("--temperature", type=float, default=0.0, help="default: 0")
    compare.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false", help="let requests stop at EOS")
    compare.add_argument("--timeout", type=_positive(float), default=300.0, help="per-request limit, s (300)")
    compare.add_argument("--switch-timeout", type=_positive(float), default=60.0, help="per policy switch, s (60)")
    compare.add_argument("--seed", type=int, default=0, help="prompts (plus the round) and the bootstrap (0)")
    compare.add_argument(
        "--workload", choices=WORKLOADS, default="random", help="random words (default), or mixed: copy and free-form"
    )
    compare.add_argument("--copy-share", type=float, help="mixed: share of copy-heavy requests, 0-1 (default 0.5)")
    compare.add_argument("--resamples", type=_positive(int), default=DEFAULT_RESAMPLES, help="bootstrap resamples")
    compare.add_argument(
        "--out", help="path prefix of PREFIX.md/.json/*.png (default compare-TIME in the current folder)"
    )
    compare.set_defaults(bench_run=run_compare, policy_backend=policies)


def run(args: argparse.Namespace) -> int:
    return args.bench_run(args)


def base_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BenchError(f"--url {url!r}: need http(s)://HOST[:PORT][/PATH]")
    # A bare host means the usual OpenAI prefix; any other path is taken as the API's base.
    return url.rstrip("/") + ("/v1" if parts.path in ("", "/") else "")


def lengths(args: argparse.Namespace) -> Lengths:
    """The generated requests' lengths; a trace brings its own, so a range there is an error, not ignored."""
    sizes = Lengths(args.input_len, args.output_len, args.range_ratio, args.seed)
    if args.trace is not None and args.range_ratio:
        raise BenchError(f"--range-ratio {args.range_ratio:g}: a --trace brings its own lengths")
    return sizes


def schedule(args: argparse.Namespace) -> Plan:
    """``--clients``: its phases set the run's length, so a count or duration beside them is an error."""
    if args.num_requests is not None or args.duration is not None:
        given = (
            f"--num-requests {args.num_requests}" if args.num_requests is not None else f"--duration {args.duration:g}"
        )
        raise BenchError(f"{given}: a --clients schedule sets its own length (the sum of its phases)")
    return schedule_plan(args.clients, lengths(args))


def make_plan(args: argparse.Namespace) -> Plan:
    stop = {"num_requests": args.num_requests, "duration_s": args.duration}
    sizes = lengths(args)
    if args.trace is not None:
        return trace_plan(args.trace, args.trace_speed, **stop)
    if args.clients is not None:
        return schedule(args)
    if args.num_requests is None and args.duration is None:
        stop["num_requests"] = DEFAULT_NUM_REQUESTS
    if args.concurrency is not None:
        return closed_plan(args.concurrency, sizes, **stop)
    return open_plan(args.rate, args.burstiness, sizes, args.seed, **stop)


def clients_description(args: argparse.Namespace) -> dict[str, Any]:
    phases = [{"clients": p.clients, "duration_s": p.duration_s} for p in args.clients]
    return {"kind": "clients", "phases": phases, "range_ratio": args.range_ratio}


def load_description(args: argparse.Namespace) -> dict[str, Any]:
    if args.concurrency is not None:
        return {"kind": "concurrency", "concurrency": args.concurrency, "range_ratio": args.range_ratio}
    if args.clients is not None:
        return clients_description(args)
    if args.trace is not None:
        return {"kind": "trace", "trace": args.trace, "speed": args.trace_speed}
    segments = [
        {"rate_qps": s.rate_qps, "duration_s": None if math.isinf(s.duration_s) else s.duration_s} for s in args.rate
    ]
    return {"kind": "rate", "segments": segments, "burstiness": args.burstiness, "range_ratio": args.range_ratio}


def workload_description(args: argparse.Namespace) -> dict[str, Any]:
    if args.workload == "mixed":
        return {"kind": "mixed", "copy_share": 0.5 if args.copy_share is None else args.copy_share, "seed": args.seed}
    return {"kind": args.workload, "seed": args.seed}


def run_load(args: argparse.Namespace) -> int:
    url = base_url(args.url)
    plan = make_plan(args)
    workload = make_workload(args.workload, args.seed, args.copy_share, args.tokenizer)
    from specserve.bench import client, report  # vLLM's request functions: slow to import

    model = args.model or asyncio.run(client.first_model(url, args.timeout))
    target = client.Target(url, model, args.api, args.ignore_eos, args.temperature, args.timeout)
    ignore_eos, note = asyncio.run(client.probe(target))
    if note:
        print(f"specserve bench: {note}", file=sys.stderr)
    target = client.Target(url, model, args.api, ignore_eos, args.temperature, args.timeout)
    runner = client.Runner(target, workload, progress=args.progress)
    if args.metrics_url:
        from specserve.bench import server_metrics

        before = asyncio.run(server_metrics.read_counters(args.metrics_url, args.timeout))
    outcomes, duration_s = asyncio.run(runner.run(plan))
    slo = {name: getattr(args, f"slo_{name}_ms") for name in ("ttft", "tpot", "e2e")}
    result = {
        "url": url,
        "model": model,
        "api": args.api,
        "load": load_description(args),
        "workload": workload_description(args),
        "ignore_eos": ignore_eos,
        "temperature": args.temperature,
        **report.summarize(
            outcomes, duration_s, {k: v for k, v in slo.items() if v is not None}, plan.window_s, plan.phases
        ),
    }
    if args.metrics_url:
        after = asyncio.run(server_metrics.read_counters(args.metrics_url, args.timeout))
        result["speculation"] = server_metrics.acceptance(before, after, args.metrics_url)
    if args.per_request:
        result["per_request"] = report.per_request(outcomes)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print("\n".join(report.table(result)))
    return 0


def compare_points(args: argparse.Namespace) -> list[Any]:
    from specserve.bench.compare import LoadPoint

    stop = {"num_requests": args.num_requests, "duration_s": args.duration}
    sizes = lengths(args)  # checked before a trace is read
    if args.trace is not None:
        load = {"kind": "trace", "trace": args.trace, "speed": args.trace_speed}
        return [LoadPoint(f"trace {Path(args.trace).stem}", load, trace_plan(args.trace, args.trace_speed, **stop))]
    if args.clients is not None:
        text = ",".join(f"{p.clients}:{p.duration_s:g}" for p in args.clients)
        return [LoadPoint(f"clients {text}", clients_description(args), schedule(args))]
    return [
        LoadPoint(
            f"concurrency {c}",
            {"kind": "concurrency", "concurrency": c},
            closed_plan(c, sizes, **stop),
        )
        for c in args.concurrency
    ]


def _load_note(args: argparse.Namespace) -> str:
    if args.num_requests:
        per_run = f"{args.num_requests} requests"
    elif args.duration:
        per_run = f"{args.duration:g} s of requests"
        if args.trace is None:
            per_run += f" (output tok/s: tokens streamed within those {args.duration:g} s, the drain after left out)"
    elif args.clients:
        total = sum(p.duration_s for p in args.clients)
        per_run = f"the schedule's {total:g} s (output tok/s: tokens streamed within them, the drain after left out)"
    else:
        per_run = "the whole trace"  # only a trace has no count by default
    if args.trace is not None:
        what = f"replay of trace {args.trace} at {args.trace_speed:g}x"
    else:
        unit = "tokens" if args.tokenizer else "words"
        loop = "closed loop"
        if args.clients:
            loop += ", clients " + ", then ".join(f"{p.clients} for {p.duration_s:g} s" for p in args.clients)
        what = f"{loop}, prompts of {args.input_len} {unit}, {args.output_len} output tokens"
        if args.range_ratio:
            what += f" (each uniform within ±{args.range_ratio:.0%})"
    eos = "ignore_eos" if args.ignore_eos else "stopping at EOS"
    return f"{what}, {per_run} per run, temperature {args.temperature:g}, {eos}, {args.warmup} warm-up requests"


def run_compare(args: argparse.Namespace) -> int:
    from specserve.bench.compare import (
        Comparison,
        Settings,
        default_headline,
        require_plots,
        run_cache_salt,
        write_results,
    )

    require_plots()
    url = base_url(args.url)
    backend: PolicyBackend = args.policy_backend
    specs = backend.parse(args.policies)
    if args.trace is None and args.clients is None and args.num_requests is None and args.duration is None:
        args.num_requests = COMPARE_NUM_REQUESTS
    headline = default_headline(specs)
    if args.headline is not None:
        wanted = backend.canonical(args.headline)
        headline = next((p for p in specs if backend.canonical(p) == wanted), args.headline)
    metric = METRICS[args.metric or ("e2e" if args.trace is not None else "tok_s")]
    settings = Settings(
        policies=tuple(specs),
        rounds=args.rounds,
        max_rounds=args.max_rounds or args.rounds,
        headline=headline,
        metric=metric,
        ci_width=args.ci_width,
        resamples=args.resamples,
        seed=args.seed,
    )
    if args.warmup < 0:
        raise BenchError(f"--warmup {args.warmup}: must be 0 or more")
    if args.seed < 0:
        raise BenchError(f"--seed {args.seed}: must be 0 or more")
    points = compare_points(args)
    prefix = Path(args.out or f"compare-{time.strftime('%Y%m%d-%H%M%S')}")

    from specserve.bench import client, report  # vLLM's request functions: slow to import

    make_workload(args.workload, args.seed, args.copy_share, args.tokenizer)  # bad --copy-share: before any load
    model = args.model or asyncio.run(client.first_model(url, args.timeout))
    target = client.Target(url, model, args.api, args.ignore_eos, args.temperature, args.timeout)
    ignore_eos, note = asyncio.run(client.probe(target))
    if note:
        log(f"specserve bench: {note}")
    target = client.Target(url, model, args.api, ignore_eos, args.temperature, args.timeout)

    cluster = backend.connect(args.switch_timeout)
    for spec in specs:
        cluster.canonical(spec)  # against the engines' max_k, before any load
    if model not in (served := cluster.model_ids()):
        raise BenchError(f"--url {url} serves {model!r}, the cluster's replicas serve {sorted(served)}: not one server")

    # Every run its own prefix cache (compare.run_cache_salt): the policies of a round send the same prompts.
    comparison_id, run_numbers = secrets.token_hex(6), itertools.count()

    def run_one(point: Any, round_index: int) -> dict[str, Any]:
        salted = replace(target, cache_salt=run_cache_salt(comparison_id, next(run_numbers)))
        # The round's requests: the same for every policy of the round, new ones each round.
        workload = make_workload(args.workload, args.seed + round_index, args.copy_share, args.tokenizer)
        runner = client.Runner(salted, workload, progress=False)
        outcomes, duration_s = asyncio.run(runner.run(point.plan))
        summary = report.summarize(outcomes, duration_s, {}, point.plan.window_s, point.plan.phases)
        if summary["requests"]["completed"] == 0:
            raise BenchError(f"{point.label}: a run completed no request; errors: {summary['errors']}")
        return summary

    original = cluster.current()
    comparison = Comparison(points, settings, cluster, run_one, final=original)
    document = {
        "command": shlex.join(["specserve", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "url": url,
        "model": model,
        "load_note": _load_note(args),
        "workload": workload_description(args),
        "settings": {
            "rounds": settings.rounds,
            "max_rounds": settings.max_rounds,
            "headline": settings.headline,
            "metric": settings.metric.name,
            "ci_width": settings.ci_width,
            "resamples": settings.resamples,
            "seed": settings.seed,
            "ignore_eos": ignore_eos,
            "temperature": args.temperature,
        },
        "policies": list(specs),
        "points": [{"label": p.label, "load": p.load} for p in points],
        "runs": comparison.records,
    }
    # Every run's report reaches the JSON as soon as it exists: an interrupted comparison keeps its rounds,
    # and `bench report` makes the page from whatever complete rounds there are.
    json_path = prefix.with_name(prefix.name + ".json")
    prefix.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        json_path.write_text(json.dumps(document, indent=1) + "\n")

    comparison.after_run = save

    try:
        if args.warmup:
            width = max(args.concurrency or [p.clients for p in args.clients or ()] or [4])
            log(f"specserve bench: warm-up, {args.warmup} requests at concurrency {width}")
            warm = closed_plan(width, lengths(args), num_requests=args.warmup, duration_s=None)
            # A seed no round uses.
            prompter = make_workload(args.workload, args.seed + settings.max_rounds, args.copy_share, args.tokenizer)
            asyncio.run(client.Runner(target, prompter, progress=False).run(warm))
        comparison.run()
    finally:
        _restore(cluster, original)

    for path in write_results(document, prefix, settings.metric.name):
        print(path)
    return 0


def _restore(cluster: PolicySwitch, original: str | None) -> None:
    """Leave the server under the policy it had; a failure here must not hide the one that ended the run."""
    try:
        if original is not None and cluster.current() != original:
            log(f"specserve bench: restoring policy {original}")
            cluster.switch(original)
    except Exception as exc:
        log(f"specserve bench: could not restore policy {original}: {exc}")


def run_report(args: argparse.Namespace) -> int:
    from specserve.bench.compare import merge, read_results, require_plots, write_results

    require_plots()
    if len(args.results) > 1 and not args.out:
        raise BenchError("--out: several results make a new page; say where (a path prefix)")
    documents = [(path, read_results(path)) for path in args.results]
    document = merge(documents) if len(documents) > 1 else documents[0][1]
    prefix = Path(args.out) if args.out else Path(args.results[0]).with_suffix("")
    for path in write_results(document, prefix, args.metric or document["settings"]["metric"]):
        print(path)
    return 0

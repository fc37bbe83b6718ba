"""`specserve bench run`: load on any OpenAI-compatible endpoint, one report.

The report goes to stdout (one JSON document with ``--json``, a table otherwise); the progress bar and
notes go to stderr. Bad input raises BenchError, which the top-level CLI prints as one line with exit
status 2. The client modules (they import vLLM's request functions, which pulls in torch) load only when
a run starts, so ``specserve --help`` stays fast.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from typing import Any
from urllib.parse import urlsplit

from specserve.bench.load import BenchError, Plan, Segment, closed_plan, open_plan, parse_rate, trace_plan

DEFAULT_NUM_REQUESTS = 100


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


def _rate(text: str) -> list[Segment]:
    try:
        return parse_rate(text)
    except BenchError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_commands(parser: argparse.ArgumentParser, dest: str) -> None:
    commands = parser.add_subparsers(dest=dest, required=True)
    run = commands.add_parser("run", help="send load, report throughput, latency percentiles, goodput, errors")
    run.add_argument("--url", required=True, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    run.add_argument("--model", help="model name to request (default: the first one GET /models lists)")
    run.add_argument("--api", choices=("completions", "chat"), default="completions", help="default: completions")
    load = run.add_mutually_exclusive_group(required=True)
    load.add_argument("--concurrency", type=_positive(int), help="closed loop: N clients, next request on answer")
    load.add_argument("--rate", type=_rate, help="open loop: QPS, or piecewise QPS:SECONDS,QPS:SECONDS,...")
    load.add_argument("--trace", help="replay a simulator trace: a built-in name or a CSV path")
    stop = run.add_mutually_exclusive_group()
    stop.add_argument("--duration", type=_positive(float), help="seconds in which requests are sent")
    stop.add_argument("--num-requests", type=_positive(int), help=f"requests to send (default {DEFAULT_NUM_REQUESTS})")
    run.add_argument("--burstiness", type=_positive(float), default=1.0, help="gamma shape of gaps (1: Poisson)")
    run.add_argument("--trace-speed", type=_positive(float), default=1.0, help="replay N times faster (default 1)")
    run.add_argument("--input-len", type=_positive(int), default=128, help="prompt tokens (not with --trace)")
    run.add_argument("--output-len", type=_positive(int), default=64, help="max_tokens (not with --trace)")
    run.add_argument("--tokenizer", help="tokenizer folder: exact prompt lengths (default: words, about 1 each)")
    run.add_argument("--temperature", type=float, default=0.0, help="default: 0")
    run.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false", help="let requests stop at EOS")
    run.add_argument("--timeout", type=_positive(float), default=300.0, help="per-request limit, s (default 300)")
    run.add_argument("--seed", type=int, default=0, help="arrival times and prompts (default 0)")
    for name in ("ttft", "tpot", "e2e"):
        run.add_argument(f"--slo-{name}-ms", type=_positive(float), help=f"goodput: {name.upper()} limit, ms")
    run.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    run.add_argument("--per-request", action="store_true", help="add one row per request to the JSON")
    run.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar on stderr")
    run.set_defaults(bench_run=run_load)


def run(args: argparse.Namespace) -> int:
    return args.bench_run(args)


def base_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BenchError(f"--url {url!r}: need http(s)://HOST[:PORT][/PATH]")
    # A bare host means the usual OpenAI prefix; any other path is taken as the API's base.
    return url.rstrip("/") + ("/v1" if parts.path in ("", "/") else "")


def make_plan(args: argparse.Namespace) -> Plan:
    stop = {"num_requests": args.num_requests, "duration_s": args.duration}
    if args.trace is not None:
        return trace_plan(args.trace, args.trace_speed, **stop)
    if args.num_requests is None and args.duration is None:
        stop["num_requests"] = DEFAULT_NUM_REQUESTS
    if args.concurrency is not None:
        return closed_plan(args.concurrency, args.input_len, args.output_len, **stop)
    return open_plan(args.rate, args.burstiness, args.input_len, args.output_len, args.seed, **stop)


def load_description(args: argparse.Namespace) -> dict[str, Any]:
    if args.concurrency is not None:
        return {"kind": "concurrency", "concurrency": args.concurrency}
    if args.trace is not None:
        return {"kind": "trace", "trace": args.trace, "speed": args.trace_speed}
    segments = [
        {"rate_qps": s.rate_qps, "duration_s": None if math.isinf(s.duration_s) else s.duration_s} for s in args.rate
    ]
    return {"kind": "rate", "segments": segments, "burstiness": args.burstiness}


def run_load(args: argparse.Namespace) -> int:
    url = base_url(args.url)
    plan = make_plan(args)
    from specserve.bench import client, report  # vLLM's request functions: slow to import
    from specserve.bench.prompts import Prompter

    model = args.model or asyncio.run(client.first_model(url, args.timeout))
    target = client.Target(url, model, args.api, args.ignore_eos, args.temperature, args.timeout)
    ignore_eos, note = asyncio.run(client.probe(target))
    if note:
        print(f"specserve bench: {note}", file=sys.stderr)
    target = client.Target(url, model, args.api, ignore_eos, args.temperature, args.timeout)
    runner = client.Runner(target, Prompter(args.seed, args.tokenizer), progress=args.progress)
    outcomes, duration_s = asyncio.run(runner.run(plan))
    slo = {name: getattr(args, f"slo_{name}_ms") for name in ("ttft", "tpot", "e2e")}
    result = {
        "url": url,
        "model": model,
        "api": args.api,
        "load": load_description(args),
        "ignore_eos": ignore_eos,
        "temperature": args.temperature,
        **report.summarize(outcomes, duration_s, {k: v for k, v in slo.items() if v is not None}),
    }
    if args.per_request:
        result["per_request"] = report.per_request(outcomes)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print("\n".join(report.table(result)))
    return 0

"""Command line: build, fetch from cache, or measure tiny model pairs. Prints JSON on stdout.

python -m specserve.models make --kind trained --out DIR
python -m specserve.models make --kind perf --size S --agreement 0.8 --out DIR
python -m specserve.models cached --kind self
python -m specserve.models make --kind eagle3 --out DIR     (an EAGLE-3 head for the cached trained pair's target)
python -m specserve.models cached --kind mtp                (that target as a MiMo model with a trained MTP layer)
python -m specserve.models measure --target DIR/target --draft DIR/draft [--k 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from specserve.models.arguments import HEAD_KINDS, add_commands, perf_options
from specserve.models.build import PairPaths, make_pair
from specserve.models.cache import cached_head_paths, cached_pair
from specserve.models.heads import HeadPaths, make_head


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m specserve.models", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_commands(parser, dest="command")
    return parser


def run(args: argparse.Namespace) -> dict[str, object]:
    """Execute parsed arguments; returns the JSON-able result."""
    if args.command in ("make", "cached") and args.kind in HEAD_KINDS:
        perf_options(args)  # rejects --size / --agreement
        return _paths_json(_head(args))
    if args.command == "make":
        options = perf_options(args)
        return _paths_json(make_pair(args.kind, args.out, seed=args.seed, progress=not args.no_progress, **options))
    if args.command == "cached":
        options = perf_options(args)
        return _paths_json(cached_pair(args.kind, args.cache_dir, progress=not args.no_progress, **options))
    # vLLM logs to stdout by default; keep stdout for the JSON result.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    from specserve.models.measure import measure_acceptance

    pair = PairPaths(target=args.target, draft=args.draft)
    return measure_acceptance(pair, k=args.k, num_prompts=args.num_prompts, max_tokens=args.max_tokens)


def main(argv: list[str] | None = None) -> int:
    result = run(build_parser().parse_args(argv))
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _head(args: argparse.Namespace) -> HeadPaths:
    progress = not args.no_progress
    if args.command == "cached":
        return cached_head_paths(args.kind, args.cache_dir, progress=progress)
    target = cached_pair("trained", progress=progress).target
    return make_head(args.kind, args.out, target, seed=args.seed, progress=progress)


def _paths_json(paths: PairPaths | HeadPaths) -> dict[str, object]:
    return {name: str(value) for name, value in dataclasses.asdict(paths).items()}


if __name__ == "__main__":
    sys.exit(main())

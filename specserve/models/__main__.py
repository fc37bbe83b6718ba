"""Command line: build, fetch from cache, or measure tiny model pairs. Prints JSON on stdout.

    python -m specserve.models make --kind trained --out DIR
    python -m specserve.models cached --kind self
    python -m specserve.models measure --target DIR/target --draft DIR/draft [--k 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from specserve.models.arguments import model_dir, positive_int
from specserve.models.build import BUILDERS, PairPaths, make_pair
from specserve.models.cache import cached_pair


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The ``make`` / ``cached`` / ``measure`` sub-commands, added to ``parser`` if one is given."""
    parser = parser or argparse.ArgumentParser(prog="python -m specserve.models", description=__doc__,
                                               formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    make = commands.add_parser("make", help="build a model pair into a folder")
    make.add_argument("--kind", required=True, choices=sorted(BUILDERS), help="which pair to build")
    make.add_argument("--out", required=True, type=Path, help="folder to create target/ and draft/ in")
    make.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    make.add_argument("--no-progress", action="store_true", help="hide the training progress bar")

    cached = commands.add_parser("cached", help="print a cached pair's folders, building it once")
    cached.add_argument("--kind", required=True, choices=sorted(BUILDERS), help="which pair")
    cached.add_argument("--cache-dir", type=Path, default=None, help="cache root (default $SPECSERVE_CACHE)")
    cached.add_argument("--no-progress", action="store_true", help="hide the training progress bar")

    measure = commands.add_parser("measure", help="measure greedy acceptance in a vLLM engine")
    measure.add_argument("--target", required=True, type=model_dir, help="target model folder")
    measure.add_argument("--draft", required=True, type=model_dir, help="draft model folder")
    measure.add_argument("--k", type=positive_int, default=4, help="draft tokens per step (default 4)")
    measure.add_argument("--num-prompts", type=positive_int, default=8, help="prompts (default 8)")
    measure.add_argument("--max-tokens", type=positive_int, default=64, help="tokens per prompt (default 64)")
    return parser


def run(args: argparse.Namespace) -> dict[str, object]:
    """Execute parsed arguments; returns the JSON-able result."""
    if args.command == "make":
        return _paths_json(make_pair(args.kind, args.out, seed=args.seed, progress=not args.no_progress))
    if args.command == "cached":
        return _paths_json(cached_pair(args.kind, args.cache_dir, progress=not args.no_progress))
    # vLLM logs to stdout by default; keep stdout for the JSON result.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    from specserve.models.acceptance import measure_acceptance

    pair = PairPaths(target=args.target, draft=args.draft)
    return measure_acceptance(pair, k=args.k, num_prompts=args.num_prompts, max_tokens=args.max_tokens)


def main(argv: list[str] | None = None) -> int:
    result = run(build_parser().parse_args(argv))
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _paths_json(paths: PairPaths) -> dict[str, object]:
    return {name: str(value) for name, value in dataclasses.asdict(paths).items()}


if __name__ == "__main__":
    sys.exit(main())

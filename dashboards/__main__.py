"""``python -m dashboards generate`` writes the dashboards' JSON; ``python -m dashboards render`` draws every
panel from a live Prometheus."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from dashboards import promql
from dashboards.build import JSON_DIR, write_all

_DURATION = re.compile(r"(\d+)([smh])")
_SECONDS = {"s": 1, "m": 60, "h": 3600}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="write one JSON file per dashboard")
    generate.add_argument("--out", type=Path, default=JSON_DIR, help=f"folder (default: {JSON_DIR})")
    render = commands.add_parser("render", help="draw every panel to a PNG from a live Prometheus")
    render.add_argument("--prometheus", required=True, help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    render.add_argument("--out", type=Path, required=True, help="folder for the PNGs")
    render.add_argument("--since", type=_duration, default=_duration("15m"), help="window ending now (default: 15m)")
    render.add_argument("--end", type=float, help="end of the window, Unix seconds (default: now)")
    render.add_argument("--rate-interval", default="1m", help="what $__rate_interval stands for (default: 1m)")
    render.add_argument(
        "--var",
        action="append",
        default=[],
        metavar="NAME=REGEX",
        help=f"a dashboard variable ({', '.join(promql.VARIABLES)}); unset ones are All (.*)",
    )
    args = parser.parse_args(argv)
    if args.command == "generate":
        for path in write_all(args.out):
            print(path)
        return 0
    from dashboards.render import render_all  # matplotlib and requests only when drawing

    values = dict(_variable(text, parser) for text in args.var)
    end_s = args.end if args.end is not None else time.time()
    rendered = render_all(args.prometheus, args.out, (end_s - args.since, end_s), values, args.rate_interval)
    for panel in rendered:
        print(f"{panel.path}  ({panel.num_series} series)")
    return 0


def _duration(text: str) -> float:
    match = _DURATION.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 15m or 2h")
    return float(int(match.group(1)) * _SECONDS[match.group(2)])


def _variable(text: str, parser: argparse.ArgumentParser) -> tuple[str, str]:
    name, _, value = text.partition("=")
    if name not in promql.VARIABLES or not value:
        parser.error(f"--var {text!r}: expected NAME=REGEX with NAME one of {', '.join(promql.VARIABLES)}")
    return name, value


if __name__ == "__main__":
    sys.exit(main())

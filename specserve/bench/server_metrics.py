"""The endpoint's own speculative-decoding counters around a run (``--metrics-url``): its acceptance as the server
counted it.

vLLM exports ``vllm:spec_decode_num_draft_tokens_total`` and ``vllm:spec_decode_num_accepted_tokens_total`` on its
Prometheus endpoint (``/metrics`` of ``vllm serve``); Ray Serve LLM re-exports them with a ``ray_`` prefix and the
colon made an underscore. Each is summed over its label sets (engines, models) and read before and after the run;
the difference is the run's. A server serves one request mix at a time here, so the counters cannot split the
mixed workload's classes: the report's ``tokens_per_chunk`` per class does that (``report.by_class``).
"""

from __future__ import annotations

import asyncio
import re

import aiohttp

from specserve.bench.load import BenchError

# A sample line: NAME{LABELS} VALUE, or NAME VALUE; the name ends in the counter's name (with or without _total).
_SAMPLE = re.compile(
    r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*?[:_]spec_decode_num_(?P<kind>draft|accepted)_tokens(?:_total)?)"
    r"(?:\{[^}]*\})?\s+(?P<value>\S+)"
)


def spec_counters(text: str) -> dict[str, float] | None:
    """Draft and accepted tokens in a Prometheus text page, summed over label sets; None without both."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if (match := _SAMPLE.match(line)) is not None:
            try:
                value = float(match["value"])
            except ValueError:
                continue
            totals[match["kind"]] = totals.get(match["kind"], 0.0) + value
    return totals if {"draft", "accepted"} <= totals.keys() else None


async def read_counters(url: str, timeout_s: float) -> dict[str, float] | None:
    try:
        async with aiohttp.ClientSession() as http, asyncio.timeout(timeout_s), http.get(url) as response:
            if response.status != 200:
                raise BenchError(f"--metrics-url {url}: HTTP {response.status}")
            return spec_counters(await response.text())
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise BenchError(f"--metrics-url {url}: unreachable ({type(exc).__name__}: {exc})") from None


def acceptance(before: dict[str, float] | None, after: dict[str, float] | None, url: str) -> dict[str, object]:
    """The run's draft and accepted tokens and their ratio; a note where the page has no such counters (a server
    without speculation, or not vLLM)."""
    if before is None or after is None:
        return {"metrics_url": url, "note": "no spec_decode draft/accepted token counters on the page"}
    drafted, accepted = after["draft"] - before["draft"], after["accepted"] - before["accepted"]
    return {
        "metrics_url": url,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance": accepted / drafted if drafted > 0 else None,
    }

"""Metrics of a run, defined as ``vllm.benchmarks.serve.calculate_metrics`` (vLLM 0.32) defines them.

Per successful request, from vLLM's ``RequestFuncOutput``:
- TTFT: send to the first streamed chunk that carries a choice.
- ITL: the gaps between consecutive such chunks (one per chunk, so a chunk with several tokens is one gap).
- E2E: send to the last such chunk (``latency``).
- output tokens: the server's ``usage.completion_tokens``.
- TPOT: ``(E2E - TTFT) / (output tokens - 1)``, for requests with more than one output token; in the
  goodput check a request with one token has TPOT 0.
- throughputs: completed requests and their tokens over the run's wall time (first send to last answer).
- window (ours; a closed loop run for a duration): output tokens streamed within the sending window, over
  the window. After it, clients stop one by one and the last requests drain at ever lower concurrency, so
  the whole-run figure mixes the load asked for with a tail whose length hangs on whether a client's last
  request began just before the window closed: at 16 clients and 64 tokens each client sends only two or
  three requests in 10 s, and one more request stretched a run by 10 %. A chunk's tokens are counted when
  it arrives: the first chunk's one token, and the rest of the request's tokens spread evenly over its later
  chunks (the stream gives chunk times, not tokens per chunk), so a request cut by the window's end is off
  by less than one chunk's tokens.
- percentiles: ``numpy.percentile`` (linear interpolation), milliseconds.

Where we differ: an endpoint that sends no usage gets its output tokens counted as streamed chunks (vLLM
counts 1 without a tokenizer); an empty metric is null instead of 0; goodput adds the share of all sent
requests that met every SLO and their output tokens per second to vLLM's good requests per second.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from specserve.bench.client import Outcome
from specserve.bench.load import Phase

PERCENTILES = (50, 90, 99)


def stats_ms(values_s: Sequence[float]) -> dict[str, float | None]:
    """mean, p50, p90, p99 in milliseconds; all None when there is no value."""
    if len(values_s) == 0:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    ms = np.asarray(values_s, dtype=np.float64) * 1000.0
    return {"mean": float(ms.mean()), **{f"p{p}": float(np.percentile(ms, p)) for p in PERCENTILES}}


def output_tokens(outcome: Outcome) -> int:
    out = outcome.output
    return int(out.output_tokens) if out.output_tokens else len(out.itl) + 1


def tpot_s(outcome: Outcome) -> float:
    n = output_tokens(outcome)
    return (outcome.output.latency - outcome.output.ttft) / (n - 1) if n > 1 else 0.0


def tokens_by(outcome: Outcome, end_s: float) -> float:
    """Output tokens of a completed request streamed by ``end_s`` (seconds from the run's start)."""
    out = outcome.output
    arrivals = outcome.sent_s + out.ttft + np.cumsum([0.0, *out.itl])
    inside = int(np.searchsorted(arrivals, end_s, side="right"))
    if inside == 0:
        return 0.0
    later = len(arrivals) - 1
    rest = output_tokens(outcome) - 1
    return 1.0 + (rest * (inside - 1) / later if later else rest)


def window(
    done: list[Outcome], duration_s: float, window_s: float | None, phases: Sequence[Phase] = ()
) -> dict[str, Any] | None:
    """Output tokens streamed within the first ``window_s`` seconds, and their rate (module docstring); None
    without a window or when the run ended before it (a request count stopped it first). A schedule of client
    counts (``--clients``) also gets each phase's tokens and rate, counted the same way."""
    if window_s is None or duration_s < window_s:
        return None
    tokens = sum(tokens_by(o, window_s) for o in done)
    result: dict[str, Any] = {"s": window_s, "output_tokens": tokens, "output_tokens_per_s": tokens / window_s}
    if phases:
        result["phases"], start_s = [], 0.0
        for phase in phases:
            end_s = start_s + phase.duration_s
            inside = sum(tokens_by(o, end_s) - tokens_by(o, start_s) for o in done)
            result["phases"].append(
                {
                    "clients": phase.clients,
                    "start_s": start_s,
                    "s": phase.duration_s,
                    "output_tokens": inside,
                    "output_tokens_per_s": inside / phase.duration_s,
                }
            )
            start_s = end_s
    return result


def summarize(
    outcomes: list[Outcome],
    duration_s: float,
    slo_ms: dict[str, float],
    window_s: float | None = None,
    phases: Sequence[Phase] = (),
) -> dict[str, Any]:
    """The report's numbers; ``slo_ms`` maps any of ``ttft``, ``tpot``, ``e2e`` to a limit; ``window_s``: a
    closed loop's sending window, ``phases`` its schedule of client counts."""
    done = [o for o in outcomes if o.error_kind is None]
    out_tokens = [output_tokens(o) for o in done]
    in_tokens = sum(o.output.prompt_len for o in done)
    per_s = 1.0 / duration_s if duration_s > 0 else 0.0
    report: dict[str, Any] = {
        "duration_s": duration_s,
        "requests": {"sent": len(outcomes), "completed": len(done), "failed": len(outcomes) - len(done)},
        "tokens": {"input": in_tokens, "output": sum(out_tokens)},
        "throughput": {
            "requests_per_s": len(done) * per_s,
            "output_tokens_per_s": sum(out_tokens) * per_s,
            "total_tokens_per_s": (in_tokens + sum(out_tokens)) * per_s,
        },
        "window": window(done, duration_s, window_s, phases),
        "ttft_ms": stats_ms([o.output.ttft for o in done]),
        "tpot_ms": stats_ms([tpot_s(o) for o in done if output_tokens(o) > 1]),
        "itl_ms": stats_ms([gap for o in done for gap in o.output.itl]),
        "e2e_ms": stats_ms([o.output.latency for o in done]),
        "goodput": goodput(outcomes, done, duration_s, slo_ms) if slo_ms else None,
        "errors": errors(outcomes),
    }
    if any(o.request_class is not None for o in outcomes):
        report["classes"] = by_class(outcomes, duration_s)
    lags = [o.sent_s - o.scheduled_s for o in outcomes if o.scheduled_s is not None]
    # Open loop only: how late the client sent its latest request; large values mean the client, not the
    # server, limited the offered load.
    report["max_send_lag_ms"] = max(lags) * 1000.0 if lags else None
    return report


def by_class(outcomes: list[Outcome], duration_s: float) -> dict[str, dict[str, Any]]:
    """The mixed workload's numbers per request class. ``output_tokens_per_s``: the class's tokens over the whole
    run's time (the classes share the run, so these add up to the total, and with equal lengths and shares they are
    equal whatever the speculation did); ``request_tokens_per_s``: the mean over its requests of output tokens over
    E2E, the speed one client of the class saw; TPOT, TTFT and E2E as for the run.

    ``tokens_per_chunk``: output tokens over streamed chunks with a token. vLLM's OpenAI server streams one chunk
    per request per engine step, and a speculative step emits the accepted drafts plus one token, so there it is
    1 + the mean accepted drafts per step: the class's acceptance as the client sees it (1 without speculation).
    A server that merges chunks (Ray Serve LLM, every 50 ms by default) raises it whatever the acceptance.
    """
    per_s = 1.0 / duration_s if duration_s > 0 else 0.0
    result = {}
    for name in sorted({o.request_class for o in outcomes if o.request_class is not None}):
        mine = [o for o in outcomes if o.request_class == name]
        done = [o for o in mine if o.error_kind is None]
        tokens = sum(output_tokens(o) for o in done)
        chunks = sum(len(o.output.itl) + 1 for o in done)
        speeds = [output_tokens(o) / o.output.latency for o in done if o.output.latency > 0]
        result[name] = {
            "requests": {"sent": len(mine), "completed": len(done), "failed": len(mine) - len(done)},
            "tokens": {"input": sum(o.output.prompt_len for o in done), "output": tokens},
            "output_tokens_per_s": tokens * per_s,
            "request_tokens_per_s": float(np.mean(speeds)) if speeds else None,
            "tokens_per_chunk": tokens / chunks if chunks else None,
            "ttft_ms": stats_ms([o.output.ttft for o in done]),
            "tpot_ms": stats_ms([tpot_s(o) for o in done if output_tokens(o) > 1]),
            "e2e_ms": stats_ms([o.output.latency for o in done]),
        }
    return result


def meets(outcome: Outcome, slo_ms: dict[str, float]) -> bool:
    values = {"ttft": outcome.output.ttft, "tpot": tpot_s(outcome), "e2e": outcome.output.latency}
    return all(values[name] * 1000.0 <= limit for name, limit in slo_ms.items())


def goodput(outcomes: list[Outcome], done: list[Outcome], duration_s: float, slo_ms: dict[str, float]) -> dict:
    good = [o for o in done if meets(o, slo_ms)]
    per_s = 1.0 / duration_s if duration_s > 0 else 0.0
    return {
        "slo_ms": dict(slo_ms),
        "requests_ok": len(good),
        "share": len(good) / len(outcomes) if outcomes else 0.0,
        "requests_per_s": len(good) * per_s,
        "output_tokens_per_s": sum(output_tokens(o) for o in good) * per_s,
    }


def errors(outcomes: list[Outcome]) -> dict[str, dict[str, Any]]:
    """Failed requests by kind: a count and the first one's message (the last line of a traceback)."""
    found: dict[str, dict[str, Any]] = {}
    for o in outcomes:
        if o.error_kind is None:
            continue
        entry = found.setdefault(o.error_kind, {"count": 0, "example": _last_line(o.output.error)})
        entry["count"] += 1
    return dict(sorted(found.items()))


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def per_request(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    rows = []
    for o in outcomes:
        ok = o.error_kind is None
        rows.append(
            {
                "index": o.index,
                "scheduled_s": o.scheduled_s,
                "sent_s": o.sent_s,
                "prompt_tokens": o.output.prompt_len,
                "max_tokens": o.max_tokens,
                "output_tokens": output_tokens(o) if ok else 0,
                "ttft_ms": o.output.ttft * 1000.0 if ok else None,
                "tpot_ms": tpot_s(o) * 1000.0 if ok else None,
                "e2e_ms": o.output.latency * 1000.0 if ok else None,
                "error": o.error_kind,
                **({"class": o.request_class} if o.request_class is not None else {}),
            }
        )
    return rows


def table(report: dict[str, Any]) -> list[str]:
    """The readable form: counts, throughputs, one latency row per metric, goodput, errors."""
    r, t = report["requests"], report["throughput"]
    lines = [
        f"target      {report['url']}  model {report['model']}  load {report['load']['kind']}",
        f"duration    {report['duration_s']:.2f} s",
        f"requests    {r['sent']} sent, {r['completed']} completed, {r['failed']} failed",
        f"tokens      {report['tokens']['input']} input, {report['tokens']['output']} output",
        f"throughput  {t['requests_per_s']:.3f} req/s, {t['output_tokens_per_s']:.2f} output tok/s",
    ]
    if (w := report.get("window")) is not None:
        rate, seconds = w["output_tokens_per_s"], w["s"]
        lines.append(f"window      {rate:.2f} output tok/s in the first {seconds:g} s (drain left out)")
        for p in w.get("phases", ()):
            span = f"{p['start_s']:g}-{p['start_s'] + p['s']:g} s"
            who = f"{p['clients']:>3} {'client ' if p['clients'] == 1 else 'clients'}"
            lines.append(f"  {who}  {span:<12} {p['output_tokens_per_s']:.2f} output tok/s")
    lines += [
        "",
        f"{'(ms)':<8}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}",
    ]
    for name in ("ttft", "tpot", "itl", "e2e"):
        row = report[f"{name}_ms"]
        cells = "".join(
            "{:>10}".format("-" if row[k] is None else f"{row[k]:.1f}") for k in ("mean", "p50", "p90", "p99")
        )
        lines.append(f"{name.upper():<8}{cells}")
    if (spec := report.get("speculation")) is not None:
        if spec.get("acceptance") is not None:
            drafted = f"{spec['accepted_tokens']:.0f} of {spec['draft_tokens']:.0f} draft tokens"
            lines.append(f"acceptance  {spec['acceptance']:.3f} ({drafted}, the server's counters)")
        else:
            lines.append(f"acceptance  - ({spec.get('note', 'no draft tokens in the run')})")
    if classes := report.get("classes"):
        head = f"{'class':<8}{'requests':>9}{'out tok/s':>11}{'tok/s/req':>11}{'TPOT mean':>11}{'TPOT p90':>10}"
        lines += ["", head + f"{'tok/chunk':>11}"]
        for name, c in classes.items():
            tpot = c["tpot_ms"]
            shown = [
                "-" if v is None else f"{v:.{digits}f}"
                for v, digits in (
                    (c["request_tokens_per_s"], 1),
                    (tpot["mean"], 1),
                    (tpot["p90"], 1),
                    (c["tokens_per_chunk"], 2),
                )
            ]
            lines.append(
                f"{name:<8}{c['requests']['completed']:>9}{c['output_tokens_per_s']:>11.2f}"
                f"{shown[0]:>11}{shown[1]:>11}{shown[2]:>10}{shown[3]:>11}"
            )
    if (g := report["goodput"]) is not None:
        slos = ", ".join(f"{k} <= {v:g} ms" for k, v in g["slo_ms"].items())
        lines += ["", f"goodput     {g['share']:.1%} of requests meet {slos}"]
        lines.append(f"            {g['requests_per_s']:.3f} req/s, {g['output_tokens_per_s']:.2f} output tok/s")
    for kind, entry in report["errors"].items():
        lines.append(f"error       {kind}: {entry['count']} ({entry['example']})")
    return lines

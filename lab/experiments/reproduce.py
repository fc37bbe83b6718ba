"""``python -m lab reproduce``: run each paper's closest built-in scenario(s) under the policies it compares.

For each paper it writes ``<out>/<paper>.md``: our numbers beside the paper's headline numbers, each with the paper's
own section, table or figure (the data are ``papers/<paper>.yaml``), plus PNGs: throughput per policy, and for
scenarios whose arrival rate changes, the chosen k over time against the rate. Absolute numbers are never comparable
(different GPUs, models, traces); each table says why in one sentence and compares the *shape*: every policy's speedup
over the paper's own baseline on the paper's metric, ours and theirs.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from lab.experiments import plots
from lab.experiments.dsde_sweep import sweep_summary
from lab.experiments.papers import Paper, PaperRun, reproduced_papers
from specserve.sim.config import PiecewiseArrivals, PoissonArrivals, Scenario
from specserve.sim.runner import run_scenario
from specserve.sim.scenario import load_scenario

# Our columns: summary key -> header.
COLUMNS = {
    "throughput_tok_s": "tok/s",
    "mean_e2e_s": "mean e2e s",
    "p99_e2e_s": "p99 e2e s",
    "mean_tpot_s": "TPOT ms",
    "acceptance": "accept",
    "mean_k": "mean k",
    "k_switches": "k switches",
}
METRIC_NAMES = {
    "throughput_tok_s": "output throughput",
    "mean_e2e_s": "mean end-to-end latency",
    "mean_tpot_s": "mean TPOT",
    "slo_attainment": "TPOT SLO attainment",
}
# Shown only for scenarios with a TPOT SLO (the summary holds None otherwise), with its own "best" line.
SLO_COLUMN = {"slo_attainment": "SLO att."}
# Markdown summaries a paper file may name (``summary:``), written before its per-run tables; each takes
# {scenario: {policy spec: summary row}} over the paper's runs.
SUMMARIES: dict[str, Callable[[dict[str, dict[str, dict]]], list[str]]] = {"dsde_sweep": sweep_summary}
PAPERS: dict[str, Paper] = reproduced_papers()


def reproduce(papers: list[str], out_dir: Path, seed: int = 0, quick_s: float | None = None) -> list[Path]:
    """Run and write every named paper's report; returns the written paths. Unknown names raise KeyError."""
    unknown = [name for name in papers if name not in PAPERS]
    if unknown:
        raise KeyError(f"unknown paper {', '.join(map(repr, unknown))}; known: {', '.join(PAPERS)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(PAPERS[name], run) for name in papers for run in PAPERS[name].runs]
    progress = tqdm(total=sum(len(run.policies) for _, run in jobs), desc="reproduce", unit="run", file=sys.stderr)
    results: dict[tuple[str, str], list[dict]] = {}
    written: list[Path] = []
    for paper, run in jobs:
        scenario = load_scenario(run.scenario)
        if quick_s is not None:
            scenario = shorten(scenario, quick_s)
        rows = []
        for spec in run.policies:
            progress.set_postfix_str(f"{run.scenario} {spec}")
            rows.append(run_scenario(scenario, cap_k(spec, scenario.engine.max_k), seed, with_series=True))
            progress.update()
        results[(paper.name, run.scenario)] = rows
        written += _plots(out_dir, paper, run, scenario, rows)
    progress.close()
    for name in papers:
        paper = PAPERS[name]
        path = out_dir / f"{name}.md"
        path.write_text(
            _report(paper, {run.scenario: results[(name, run.scenario)] for run in paper.runs}, seed, quick_s, out_dir)
        )
        written.append(path)
    return written


def cap_k(spec: str, max_k: int) -> str:
    """``fixed:k=N`` with N above the scenario's max_k becomes ``fixed:k=max_k``; other specs pass through."""
    match = re.fullmatch(r"fixed:k=(\d+)", spec)
    return f"fixed:k={min(int(match.group(1)), max_k)}" if match else spec


def shorten(scenario: Scenario, total_s: float) -> Scenario:
    """The scenario with its arrivals squeezed into ``total_s`` seconds, keeping the rate curve's shape."""
    arrivals = scenario.workload.arrivals
    if isinstance(arrivals, PoissonArrivals):
        arrivals = arrivals.model_copy(update={"duration_s": min(arrivals.duration_s, total_s)})
    elif isinstance(arrivals, PiecewiseArrivals):
        scale = min(1.0, total_s / sum(s.duration_s for s in arrivals.segments))
        arrivals = arrivals.model_copy(
            update={"segments": [s.model_copy(update={"duration_s": s.duration_s * scale}) for s in arrivals.segments]}
        )
    else:
        return scenario  # bursts and traces: not among the papers' scenarios
    return scenario.model_copy(update={"workload": scenario.workload.model_copy(update={"arrivals": arrivals})})


def rate_curve(scenario: Scenario) -> tuple[list[float], list[float]] | None:
    """(segment edges s, rates req/s) when the arrival rate changes over the run, else None."""
    arrivals = scenario.workload.arrivals
    if not isinstance(arrivals, PiecewiseArrivals) or len({s.rate_qps for s in arrivals.segments}) < 2:
        return None
    edges = [0.0]
    for segment in arrivals.segments:
        edges.append(edges[-1] + segment.duration_s)
    return edges, [s.rate_qps for s in arrivals.segments]


def _plots(out_dir: Path, paper: Paper, run: PaperRun, scenario: Scenario, rows: list[dict]) -> list[Path]:
    stem = out_dir / _stem(paper, run)
    paths = [
        plots.throughput_bars(
            stem.with_name(stem.name + "-throughput.png"),
            run.scenario,
            list(run.policies),
            [row["throughput_tok_s"] for row in rows],
        )
    ]
    curve = rate_curve(scenario)
    if curve is not None:
        series = {
            spec: row["k_series"] for spec, row in zip(run.policies, rows, strict=True) if not spec.startswith("fixed:")
        }
        paths.append(
            plots.k_over_time(stem.with_name(stem.name + "-k.png"), f"{run.scenario}: k over time", series, curve)
        )
    return paths


def _report(paper: Paper, results: dict[str, list[dict]], seed: int, quick_s: float | None, out_dir: Path) -> str:
    lines = [
        f"# {paper.title}: our simulator beside the paper",
        "",
        f"Paper: {paper.reference}.",
        "",
        f"Generated by `python -m lab reproduce --seed-paper {paper.name} --seed {seed}"
        f"{' --quick' if quick_s else ''}`. Speedup columns are over `{paper.baseline}` on "
        f"{METRIC_NAMES[paper.metric]} (ours) and over the paper's counterpart on the paper's metric (paper); "
        ">1 is better.",
        "",
    ]
    if paper.summary is not None:
        lines += SUMMARIES[paper.summary](
            {run.scenario: dict(zip(run.policies, results[run.scenario], strict=True)) for run in paper.runs}
        )
    for run in paper.runs:
        lines += _run_section(paper, run, dict(zip(run.policies, results[run.scenario], strict=True)), out_dir)
    return "\n".join(lines)


def _run_section(paper: Paper, run: PaperRun, by_spec: dict[str, dict], out_dir: Path) -> list[str]:
    """One run's markdown: the scenario, why it differs, the paper's shape, the table, and its plots."""
    base = by_spec[paper.baseline][paper.metric]
    has_slo = any(row.get("slo_attainment") is not None for row in by_spec.values())
    columns = {**COLUMNS, **SLO_COLUMN} if has_slo else COLUMNS
    lines = [
        f"## {run.scenario}",
        "",
        load_scenario(run.scenario).description.strip(),
        "",
        f"**Not comparable in absolute terms:** {run.not_comparable}",
        "",
        f"**Paper's shape:** {run.shape}",
        "",
        "| policy | " + " | ".join(columns.values()) + " | ours speedup | paper counterpart | paper "
        "headline | paper speedup |",
        "|---" * (len(columns) + 5) + "|",
    ]
    for spec, row in by_spec.items():
        ref, theirs = run.refs.get(spec), paper.paper_speedup(run, spec)
        ours = _speedup(row[paper.metric], base, paper.higher_is_better)
        cells = [_fmt(key, row[key]) for key in columns]
        paper_cells = (
            [ref.label, ref.quote, f"{theirs:.2f}x" if theirs else "—"]
            if ref
            else ["—", "not comparable: no counterpart in the paper's table", "—"]
        )
        lines.append(f"| `{spec}` | " + " | ".join(cells) + f" | {ours} | " + " | ".join(paper_cells) + " |")
    best = max(by_spec, key=lambda s: by_spec[s][paper.metric] * (1 if paper.higher_is_better else -1))
    lines += ["", f"Best here on {METRIC_NAMES[paper.metric]}: `{best}`."]
    if has_slo:
        top = max(row["slo_attainment"] for row in by_spec.values())
        tied = [f"`{spec}`" for spec, row in by_spec.items() if row["slo_attainment"] == top]
        lines += [f"Highest {METRIC_NAMES['slo_attainment']} ({top:.1%} of requests): {', '.join(tied)}."]
    stem = _stem(paper, run)
    lines += ["", f"![throughput]({stem}-throughput.png)"]
    if (out_dir / f"{stem}-k.png").exists():
        lines.append(f"![k over time]({stem}-k.png)")
    lines.append("")
    return lines


def _stem(paper: Paper, run: PaperRun) -> str:
    """File stem of a run's plots: the scenario name, prefixed by the paper's unless it already starts with it."""
    return run.scenario if run.scenario.startswith(paper.name) else f"{paper.name}-{run.scenario}"


def _speedup(value: float, base: float, higher_is_better: bool) -> str:
    if value <= 0 or base <= 0:
        return "—"
    return f"{(value / base if higher_is_better else base / value):.2f}x"


def _fmt(key: str, value: float | int) -> str:
    if key == "slo_attainment":
        return f"{value:.1%}"
    if key == "mean_tpot_s":
        return f"{value * 1e3:.2f}"
    if key == "throughput_tok_s":
        return f"{value:.0f}"
    return str(value) if isinstance(value, int) else f"{value:.2f}"

"""``specserve sim reproduce``: run each paper's closest built-in scenario(s) under the policies it compares.

For each paper it writes ``<out>/<paper>.md``: our numbers beside the paper's headline numbers as quoted in its
digest (research/<paper>.md, with the section), plus PNGs: throughput per policy, and for scenarios whose arrival
rate changes, the chosen k over time against the rate. Absolute numbers are never comparable (different GPUs,
models, traces); each table says why in one sentence and compares the *shape*: every policy's speedup over the
paper's own baseline on the paper's metric, ours and theirs.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from specserve.experiments import plots
from specserve.sim.config import PiecewiseArrivals, PoissonArrivals, Scenario
from specserve.experiments.dsde_sweep import sweep_summary
from specserve.sim.runner import run_scenario
from specserve.sim.scenario import load_scenario

# Our columns: summary key -> header.
COLUMNS = {"throughput_tok_s": "tok/s", "mean_e2e_s": "mean e2e s", "p99_e2e_s": "p99 e2e s",
           "mean_tpot_s": "TPOT ms", "acceptance": "accept", "mean_k": "mean k", "k_switches": "k switches"}
METRIC_NAMES = {"throughput_tok_s": "output throughput", "mean_e2e_s": "mean end-to-end latency",
                "mean_tpot_s": "mean TPOT", "slo_attainment": "TPOT SLO attainment"}
# Shown only for scenarios with a TPOT SLO (the summary holds None otherwise), with its own "best" line.
SLO_COLUMN = {"slo_attainment": "SLO att."}


@dataclass(frozen=True, slots=True)
class PaperRef:
    """The paper's counterpart of one of our policies."""

    label: str  # the paper's name for the method
    quote: str  # its headline number(s), quoted from the digest, with the section
    speedup: float | None = None  # over the paper's baseline on the paper's metric (>1 better); None: not given


@dataclass(frozen=True, slots=True)
class PaperRun:
    scenario: str  # built-in scenario name
    policies: tuple[str, ...]
    refs: dict[str, PaperRef]  # policy spec -> counterpart; policies without one show a dash
    not_comparable: str  # one sentence: why absolute numbers differ
    shape: str  # what the paper says the comparison looks like


@dataclass(frozen=True, slots=True)
class Paper:
    name: str
    title: str
    metric: str  # our summary key the speedup column is computed on
    higher_is_better: bool
    baseline: str  # policy spec the speedups are relative to
    runs: tuple[PaperRun, ...] = field(default_factory=tuple)
    # Markdown lines across all runs (scenario -> {policy spec: summary row}), written before the per-run tables.
    summary: Callable[[dict[str, dict[str, dict]]], list[str]] | None = None


def _mean(*cells: float) -> float:
    return sum(cells) / len(cells)


_TS_ORG = _mean(2.63, 3.39, 4.86, 13.73)  # TurboSpec Table 4, L40S Vicuna-7B draft ShareGPT, QPS 1/4/8/16
_NJ7 = 3653.61  # Nightjar Table 5 w/o SD, 7B ShareGPT
_NJ13 = 1290.04  # Nightjar Table 5 w/o SD, 13B ShareGPT
_SK4 = _mean(105.02, 119.70, 127.82, 110.48)  # SpecKV §5.1 Fig. 1 vLLM FP16 gamma=4, mean over 4 tasks

_NJ_NOTE = ("Nightjar's throughput counts prompt plus output tokens on an unpublished Azure trace segment; ours counts "
            "output tokens under a piecewise stand-in rate, so only ratios to w/o SD are compared.")
_NJ_POLICIES = ("fixed:k=0", "fixed:k=3", "ucb", "bandit", "adaptive")


def _nightjar_refs(col: str, base: float, sd: float, bandit: float, nj: float, e2e: tuple[float, ...]) -> dict:
    where = f"§4.3 Tables 5-6, {col}"
    return {
        "fixed:k=0": PaperRef("w/o SD", f"{base} tok/s, E2E {e2e[0]} ms ({where})", 1.0),
        "fixed:k=3": PaperRef("SD", f"{sd} tok/s, E2E {e2e[1]} ms ({where})", sd / base),
        "ucb": PaperRef("BanditSpec", f"{bandit} tok/s, E2E {e2e[2]} ms ({where})", bandit / base),
        "bandit": PaperRef("Nightjar", f"{nj} tok/s, E2E {e2e[3]} ms ({where})", nj / base),
    }


_DSDE_POLICIES = ("fixed:k=0", "fixed:k=2", "fixed:k=4", "fixed:k=6", "fixed:k=8", "fixed:k=10", "kld", "kld:cap=false",
                  "adaptive")
_DSDE_REFS = {
    "fixed:k=0": PaperRef("autoregressive", "38.41 s, 1.00x (§5 Table III a, T=0)", 1.0),
    "fixed:k=2": PaperRef("Static-Conservative SL=2", "dialogue 22.24 s, BE 2.54 (§5 Table I)"),
    "fixed:k=8": PaperRef("Static-Aggressive SL=8", "dialogue 19.27 s, BE 4.81 (§5 Table I); static-opt over SL 2-10 "
                                                    "13.44 s, 2.86x (Table III a)"),
    "kld": PaperRef("Proposed Dynamic SL", "13.97 s, 2.75x (§5 Table III a)", 38.41 / 13.97),
    "kld:cap=false": PaperRef("Dynamic SL (No Cap)", "batch-64 throughput 11.21x batch 1, vs 12.16x with SL_cap "
                                                    "(§5 Fig. 9, T=0)"),
}
_DSDE_NOTE = ("Table III is one mean latency per method over unstated datasets and batch sizes; this is one batch cap "
              "of our sweep over the same 128 ShareGPT-length prompts, so only speedups over autoregressive are "
              "compared (the sweep table sets the caps side by side).")
_DSDE_SHAPE = ("DSDE within 4% of static-opt (3.9% slower at T=0) without per-dataset profiling, both far ahead of "
               "autoregressive (Table III); SL_cap lifts the batch-64 over batch-1 throughput ratio from 11.21x to "
               "12.16x and does nothing at batch 1 (Fig. 9).")

PAPERS: dict[str, Paper] = {p.name: p for p in (
    Paper("turbospec", "TurboSpec (research/turbospec.md)", "mean_e2e_s", False, "fixed:k=0", (
        PaperRun("turbospec-h100-qps-sweep", tuple(f"fixed:k={k}" for k in range(5)) + ("goodput",), {
            "fixed:k=0": PaperRef("Org", "2.63 / 3.39 / 4.86 / 13.73 s at QPS 1/4/8/16 (§5.3 Table 4)", 1.0),
            "fixed:k=1": PaperRef("k=1", "1.85 / 2.51 / 3.78 / 15.91 s (§5.3 Table 4)",
                                  _TS_ORG / _mean(1.85, 2.51, 3.78, 15.91)),
            "fixed:k=3": PaperRef("k=3", "1.36 / 1.91 / 2.91 / 15.01 s (§5.3 Table 4)",
                                  _TS_ORG / _mean(1.36, 1.91, 2.91, 15.01)),
            "goodput": PaperRef("TurboSpec", "1.34 / 1.90 / 2.98 / 13.62 s (§5.3 Table 4)",
                                _TS_ORG / _mean(1.34, 1.90, 2.98, 13.62)),
        }, "Table 4's Vicuna-7B block is an L40S with one run per QPS, while our scenario is Llama-2-7B on an H100 "
           "with the four QPS levels back to back in one run, so we compare speedups of mean latency (the paper's "
           "over the mean of its four cells).",
           "TS within about -5% to +7% of the best static k per cell, 1.3-3.3x over Org at low QPS, static k >= 3 "
           "blowing up at QPS 16 where TS stays near Org (§5.4, §7 item 5)."),
        PaperRun("turbospec-h100-dynamic-qps", ("fixed:k=0", "fixed:k=1", "fixed:k=3", "goodput"), {},
                 "§7.2 / Fig. 13 gives latency CDFs only, no table, so there are no numbers to set beside ours.",
                 "TS on or near the Pareto front of k=1 and k=3, long tails for w/o SD and k=5 (§5.1, §7 item 6); "
                 "speculation switched off once the rate reaches about 8 QPS (§8.1a)."),
    )),
    Paper("nightjar", "Nightjar (research/nightjar.md)", "throughput_tok_s", True, "fixed:k=0", (
        PaperRun("nightjar-4090-7b-dynamic", _NJ_POLICIES,
                 _nightjar_refs("7B ShareGPT", _NJ7, 3593.36, 3428.75, 3734.23, (6938.47, 7047.49, 7799.63, 6534.76)),
                 _NJ_NOTE, "On the 4090/7B profile fixed SD is below w/o SD and Nightjar is w/o SD + 1-4% (§4.3, §6 "
                           "item 6)."),
        PaperRun("nightjar-a100-13b-dynamic", _NJ_POLICIES,
                 _nightjar_refs("13B ShareGPT", _NJ13, 1689.53, 1383.81, 1729.68, (9350.87, 8152.97, 9667.04, 8133.92)),
                 _NJ_NOTE, "On the 13B profile SD helps a lot and Nightjar adds 2-15% on top; w/o SD 25-40% lower "
                           "(§4.3, §6 item 6)."),
    )),
    Paper("adaspec", "AdaSpec (research/adaspec.md)", "mean_tpot_s", False, "fixed:k=0", (
        PaperRun("adaspec-a100-7b-trace", ("fixed:k=0", "fixed:k=3", "slo", "slo:guard=false", "adaptive"), {
            "fixed:k=0": PaperRef("autoregressive", "1.00x (§5.1)", 1.0),
            "fixed:k=3": PaperRef("fixed SL=3", "best fixed length (§5.5); AdaSpec 7-18% faster than fixed 1/3/5 "
                                                "(§5.1)"),
            "slo": PaperRef("AdaSpec", "1.73x on trace 1 (§5.2 Table 2); 1.23-1.79x over 12 configurations (§5.1)",
                            1.73),
            "slo:guard=false": PaperRef("AdaSpec, released code", "the same system with the §5.3 SLO guard commented "
                                                                   "out, as the authors' code ships it"),
        }, "Table 2's model and GPU are not stated and its speedup is end to end on the 10-minute trace 1; ours is a "
           "4x time-compressed stand-in on A100 7B, so we compare speedup as the ratio of mean TPOT. The engine "
           "verifies by batch expansion, as AdaSpec's vLLM 0.6.3 fork does (Eq. 4: k drafts read each request's KV "
           "k + 1 times); with vLLM V1's single-pass verifier every speculative policy here was about 2.1x. The "
           "paper's SLO guard compares a whole speculative step with the TPOT SLO; at this SLO (the autoregressive "
           "P90, 17 ms) a verification step of a dozen requests exceeds it, so `slo` turns speculation off in the "
           "busy phases and loses TPOT and attainment. Without the guard (the released code) it has the highest "
           "attainment, the paper's shape.",
           "AdaSpec 1.23-1.79x over autoregressive and 7-18% over the best fixed length; its k moves inversely with "
           "batch size, 2-4 in high-rate phases and 4-7 in low-rate ones (§5.1, §5.5). With the SLO at autoregressive "
           "P90 TPOT (ours too, so autoregressive attains about 90% by construction), AdaSpec is the only method "
           "above 90% SLO attainment, up to 38% above the others (§5.3, Fig. 11)."),
    )),
    Paper("dsde", "DSDE (research/dsde.md)", "mean_e2e_s", False, "fixed:k=0",
          tuple(PaperRun(f"dsde-a100x8-70b-bs{batch}", _DSDE_POLICIES, _DSDE_REFS, _DSDE_NOTE, _DSDE_SHAPE)
                for batch in (1, 8, 32, 64)),
          summary=sweep_summary),
    Paper("speckv", "SpecKV (research/speckv.md)", "mean_tpot_s", False, "fixed:k=4", (
        PaperRun("speckv-3090-3b", ("fixed:k=2", "fixed:k=4", "fixed:k=6", "fixed:k=8", "mlp", "mlp:objective=tokens"), {
            "fixed:k=2": PaperRef("gamma=2", "113.9 tok/s, mean of 4 tasks (§5.1 Fig. 1, vLLM FP16)",
                                  _mean(108.00, 115.64, 120.46, 111.58) / _SK4),
            "fixed:k=4": PaperRef("gamma=4 (Fixed-4)", "115.8 tok/s (§5.1 Fig. 1); 3.67 tokens/step (Table 4 FP16)", 1.0),
            "fixed:k=6": PaperRef("gamma=6", "112.2 tok/s (§5.1 Fig. 1)", _mean(96.94, 119.38, 128.72, 103.70) / _SK4),
            "fixed:k=8": PaperRef("gamma=8", "103.9 tok/s (§5.1 Fig. 1)", _mean(84.64, 111.88, 124.58, 94.40) / _SK4),
            "mlp:objective=tokens": PaperRef("SpecKV-fast (Eq. 1)", "5.68 tokens/step, +54.8% over Fixed-4 "
                                                                    "(§5 Table 4 FP16; not served speed)"),
        }, "Fig. 1's tok/s is batch-1 decode speed over four tasks on vLLM V0 and Table 4's gain is expected tokens "
           "per step on recorded steps, not served speed, so we compare decode speed as the ratio of mean TPOT to "
           "fixed k=4.",
           "Fixed gamma 2-6 within 3% of each other with gamma 8 about 10% slower (Fig. 1); SpecKV +56% tokens per "
           "step over Fixed-4 (Table 4), a metric that rewards long k regardless of its cost."),
    )),
)}


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
        path.write_text(_report(paper, {run.scenario: results[(name, run.scenario)] for run in paper.runs}, seed,
                                quick_s, out_dir))
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
        arrivals = arrivals.model_copy(update={"segments": [
            s.model_copy(update={"duration_s": s.duration_s * scale}) for s in arrivals.segments]})
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
    paths = [plots.throughput_bars(stem.with_name(stem.name + "-throughput.png"), run.scenario, list(run.policies),
                                   [row["throughput_tok_s"] for row in rows])]
    curve = rate_curve(scenario)
    if curve is not None:
        series = {spec: row["k_series"] for spec, row in zip(run.policies, rows) if not spec.startswith("fixed:")}
        paths.append(plots.k_over_time(stem.with_name(stem.name + "-k.png"), f"{run.scenario}: k over time",
                                       series, curve))
    return paths


def _report(paper: Paper, results: dict[str, list[dict]], seed: int, quick_s: float | None, out_dir: Path) -> str:
    lines = [f"# {paper.title}: our simulator beside the paper", "",
             f"Generated by `specserve sim reproduce --seed-paper {paper.name} --seed {seed}"
             f"{' --quick' if quick_s else ''}`. Speedup columns are over `{paper.baseline}` on "
             f"{METRIC_NAMES[paper.metric]} (ours) and over the paper's counterpart on the paper's metric (paper); "
             ">1 is better.", ""]
    if paper.summary is not None:
        lines += paper.summary({run.scenario: dict(zip(run.policies, results[run.scenario])) for run in paper.runs})
    for run in paper.runs:
        rows = results[run.scenario]
        by_spec = dict(zip(run.policies, rows))
        base = by_spec[paper.baseline][paper.metric]
        has_slo = any(row.get("slo_attainment") is not None for row in rows)
        columns = {**COLUMNS, **SLO_COLUMN} if has_slo else COLUMNS
        lines += [f"## {run.scenario}", "", load_scenario(run.scenario).description.strip(), "",
                  f"**Not comparable in absolute terms:** {run.not_comparable}", "",
                  f"**Paper's shape:** {run.shape}", "",
                  "| policy | " + " | ".join(columns.values()) + " | ours speedup | paper counterpart | paper "
                  "headline | paper speedup |",
                  "|---" * (len(columns) + 5) + "|"]
        for spec, row in by_spec.items():
            ref = run.refs.get(spec)
            ours = _speedup(row[paper.metric], base, paper.higher_is_better)
            cells = [_fmt(key, row[key]) for key in columns]
            paper_cells = [ref.label, ref.quote, f"{ref.speedup:.2f}x" if ref.speedup else "—"] if ref else \
                ["—", "not comparable: no counterpart in the paper's table", "—"]
            lines.append(f"| `{spec}` | " + " | ".join(cells) + f" | {ours} | " + " | ".join(paper_cells) + " |")
        best = max(by_spec, key=lambda s: by_spec[s][paper.metric] * (1 if paper.higher_is_better else -1))
        lines += ["", f"Best here on {METRIC_NAMES[paper.metric]}: `{best}`."]
        if has_slo:
            top = max(row["slo_attainment"] for row in rows)
            tied = [f"`{spec}`" for spec, row in by_spec.items() if row["slo_attainment"] == top]
            lines += [f"Highest {METRIC_NAMES['slo_attainment']} ({top:.1%} of requests): {', '.join(tied)}."]
        lines.append("")
        stem = _stem(paper, run)
        lines.append(f"![throughput]({stem}-throughput.png)")
        if (out_dir / f"{stem}-k.png").exists():
            lines.append(f"![k over time]({stem}-k.png)")
        lines.append("")
    return "\n".join(lines)


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

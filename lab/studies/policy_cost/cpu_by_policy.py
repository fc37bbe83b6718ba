"""Where each policy's time goes on one served engine: vLLM's benchmark client, policies switched in turn.

    PYTHONPATH=$PWD .venv/bin/python lab/studies/policy_cost/cpu_by_policy.py \
        [--arms fixed:k=0,adaptive] [--rounds 4] [--num-prompts 128] [--out bench/results/cpu-by-policy]

One fresh `specserve serve` (the bundled tiny pair) for the whole run; each round sets every arm in turn with
`specserve policy set` (the order rotating from round to round) and runs `vllm bench serve`'s load on it (as
``bench/cold_start.py`` does), while ``lab.instruments.cpu_share`` reads the CPU seconds of every process of the
server by role, and the load generator's from this process's reaped children. One untimed load first warms
the engine up. On a 2-core machine every process
shares the engine's cores, so a policy that costs CPU outside the engine (telemetry, metrics, the controller)
slows the engine's steps without showing in its own step time; this shows whether it does.

The engine writes a step log (``speculation.step_log``), and each run's steps are split into what the arms can
differ by, in milliseconds per output token: the target's forward passes, the draft's passes (catch-ups and
probes included), the rest of each step (scheduling, the policy's choose and observe, output processing), and the
time between steps. Per round, adaptive's figure minus the reference arm's, over the reference's whole: the share
of a run each part costs it; medians over rounds. Writes PREFIX.json and PREFIX.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench"))
from cold_start import add_load_args, serve, set_policy, vllm_bench  # noqa: E402  (a benchmark script's helpers)
from serve_overhead import stop_server, wait_for_endpoint  # noqa: E402

from lab.instruments.cpu_share import CpuTally  # noqa: E402
from specserve.bench.stats import median_interval  # noqa: E402

LOAD = "load generator"
PARTS = ("forward", "draft passes", "rest of the step", "between steps")


def step_parts(lines: list[str], output_tokens: int) -> dict[str, float]:
    """A run's logged steps split into ``PARTS``, ms per output token, with its step and draft-pass counts."""
    logged = [json.loads(line) for line in lines]
    records = [entry["record"] for entry in logged]
    # A gap before a step that found nothing running is the engine waiting for the client, not its own time.
    between_s = sum(
        now["record"]["now_s"] - last["now_s"] - last["duration_s"]
        for last, now in zip(records, logged[1:], strict=False)
        if now["ctx"]["num_running"] > 0
    )
    step_s = sum(r["duration_s"] for r in records)
    forward_s = sum(r.get("forward_s") or 0.0 for r in records)
    draft_s = sum(r.get("draft_s") or 0.0 for r in records)
    seconds = {
        "forward": forward_s,
        "draft passes": draft_s,
        "rest of the step": step_s - forward_s - draft_s,
        "between steps": between_s,
    }
    out = {part: 1e3 * value / output_tokens for part, value in seconds.items()}
    out |= {"steps": len(records), "steps at k > 0": sum(r["k"] > 0 for r in records)}
    return out | {"draft passes run": sum(r["num_draft_passes"] for r in records)}


def new_lines(path: Path, offset: int) -> list[str]:
    """The lines appended to ``path`` past byte ``offset``: a run's steps, without reading the whole log again."""
    with path.open("rb") as log:
        log.seek(offset)
        return log.read().decode().splitlines()


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", default="fixed:k=0,adaptive")
    parser.add_argument("--rounds", type=int, default=4)
    add_load_args(parser, num_prompts=128, port=8766, out="bench/results/policy-time-parts-tiny")
    parser.add_argument("--summarize", metavar="JSON", help="rewrite JSON's summary and page from its runs; no load")
    args = parser.parse_args()
    if args.summarize:
        return resummarize(Path(args.summarize))
    arms = args.arms.split(",")
    prefix = Path(args.out)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="cpu-by-policy-") as folder:
        log, steps = Path(folder) / "serve.log", Path(folder) / "steps.jsonl"
        process = serve(arms[0], args.port, log, Path(folder), step_log=steps)
        try:
            wait_for_endpoint(log, process, f"http://127.0.0.1:{args.port}/v1", 600)
            # A first load only warms the engine up: right after start-up every process is slower.
            vllm_bench(args, args.port, seed=args.rounds, result_dir=Path(folder))
            for round_index in range(args.rounds):
                turn = round_index % len(arms)
                for arm in arms[turn:] + arms[:turn]:
                    set_policy(arm, Path(folder))
                    tally = CpuTally(process.pid, root_role="specserve serve (CLI)")
                    logged = steps.stat().st_size  # the run's steps are the lines appended from here
                    tally.start()
                    before = children_cpu_s()
                    result = vllm_bench(args, args.port, seed=round_index, result_dir=Path(folder))
                    tally.stop()
                    tally.roles[LOAD] = round(children_cpu_s() - before, 3)
                    tokens = int(result["total_output_tokens"])
                    run = {
                        "round": round_index,
                        "arm": arm,
                        "output_throughput": result["output_throughput"],
                        **tally.report(tokens),
                        "step_ms_per_output_token": step_parts(new_lines(steps, logged), tokens),
                    }
                    runs.append(run)
                    print(
                        f"round {round_index + 1}: {arm}: {run['output_throughput']:.0f} tok/s, "
                        f"{sum(run['cpu_ms_per_output_token'].values()):.2f} CPU ms/token",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            stop_server(process)
    document = {"command": " ".join(sys.argv), "settings": vars(args), "runs": runs, "summary": summarize(runs, arms)}
    prefix.with_suffix(".json").write_text(json.dumps(document, indent=2) + "\n")
    prefix.with_suffix(".md").write_text(page(document, prefix.name))
    print(page(document, prefix.name))
    return 0


def resummarize(path: Path) -> int:
    document = json.loads(path.read_text())
    document["summary"] = summarize(document["runs"], document["settings"]["arms"].split(","))
    path.write_text(json.dumps(document, indent=2) + "\n")
    path.with_suffix(".md").write_text(page(document, path.stem))
    print(page(document, path.stem))
    return 0


def summarize(runs: list[dict], arms: list[str]) -> dict:
    """Per arm: the median tok/s and CPU ms per output token by role over rounds; against the first arm (the
    reference), the paired per-round ratio of tok/s and each step part's difference over the reference's whole."""
    roles = sorted({role for run in runs for role in run["cpu_ms_per_output_token"]})
    rounds = sorted({run["round"] for run in runs})
    at = {(run["round"], run["arm"]): run for run in runs}
    reference = arms[0]
    out: dict[str, dict] = {}
    for arm in arms:
        mine = [at[(i, arm)] for i in rounds]
        row: dict = {
            "tok_s": float(np.median([run["output_throughput"] for run in mine])),
            "cpu_ms_per_token": {
                role: float(np.median([run["cpu_ms_per_output_token"].get(role, 0.0) for run in mine]))
                for role in roles
            },
            "step_ms_per_token": {
                part: float(np.median([run["step_ms_per_output_token"][part] for run in mine])) for part in PARTS
            },
        }
        if arm != reference:
            ratios = [at[(i, arm)]["output_throughput"] / at[(i, reference)]["output_throughput"] for i in rounds]
            row["tok_s_ratio"] = interval_of(ratios)
            row["tok_s_ratio_from_parts"] = interval_of(
                [(1.0 + overhead(at[(i, reference)])) / (1.0 + overhead(at[(i, arm)])) for i in rounds]
            )
            row["over_forward"] = {
                part: interval_of(
                    [
                        (over_forward(at[(i, arm)], part) - over_forward(at[(i, reference)], part))
                        / (1.0 + overhead(at[(i, reference)]))
                        for i in rounds
                    ]
                )
                for part in PARTS[1:]
            }
            row["share_of_reference_run"] = {}
            for part in [*PARTS, "all"]:
                shares = []
                for i in rounds:
                    mine_parts, theirs = at[(i, arm)]["step_ms_per_output_token"], at[(i, reference)]
                    whole = sum(theirs["step_ms_per_output_token"][p] for p in PARTS)
                    used = PARTS if part == "all" else (part,)
                    extra = sum(mine_parts[p] - theirs["step_ms_per_output_token"][p] for p in used)
                    shares.append(extra / whole)
                row["share_of_reference_run"][part] = interval_of(shares)
        out[arm] = row
    return out


def over_forward(run: dict, part: str) -> float:
    """A part of the run's steps over its target forward passes' time: the machine's speed cancels out."""
    parts = run["step_ms_per_output_token"]
    return parts[part] / parts["forward"]


def overhead(run: dict) -> float:
    """Everything but the target's forward passes, over them."""
    return sum(over_forward(run, part) for part in PARTS[1:])


def interval_of(values: list[float]) -> dict:
    interval = median_interval(np.array(values))
    return {"median": interval.value, "interval_95": [interval.low, interval.high], "rounds": values}


def page(document: dict, stem: str) -> str:
    summary = document["summary"]
    arms = list(summary)
    reference = arms[0]
    roles = sorted({role for row in summary.values() for role in row["cpu_ms_per_token"]})
    head = "| | " + " | ".join(f"`{arm}`" for arm in arms) + " |"
    rule = "|---|" + "---|" * len(arms)
    lines = [
        "# Where each policy's time goes on one served engine",
        "",
        f"`{document['command']}`",
        "",
        "One server for the whole run (the tiny pair, vLLM's benchmark client: random prompts); the arms set in turn "
        "on it, their order rotating from round to round. Medians over rounds.",
        "",
        f"## Against `{reference}`, round by round",
        "",
        "Each part: the arm's milliseconds per output token minus the reference's in the same round, over the "
        "reference's whole (the four parts); median [95 % interval].",
        "",
        "| | " + " | ".join(f"`{arm}`" for arm in arms[1:]) + " |",
        "|---|" + "---|" * (len(arms) - 1),
    ]

    def cell(entry: dict, percent: bool) -> str:
        low, high = entry["interval_95"]
        if percent:
            return f"{100 * entry['median']:+.2f} % [{100 * low:+.2f}, {100 * high:+.2f}]"
        return f"{entry['median']:.3f} [{low:.3f}, {high:.3f}]"

    ratios = " | ".join(cell(summary[a]["tok_s_ratio"], False) for a in arms[1:])
    lines.append(f"| output tok/s, ratio | {ratios} |")
    for part in [*PARTS, "all"]:
        cells = " | ".join(cell(summary[a]["share_of_reference_run"][part], True) for a in arms[1:])
        lines.append(f"| {part} | {cells} |")
    lines += [
        "",
        "The machine's speed drifts from run to run by more than the arms differ, and moves every part with it. "
        "Taken over the same run's target forward passes instead (the speed cancels; the arms' forward work per "
        "token is the same but for their few steps at k > 0), each part's excess over the reference, as a share of "
        "the reference's run, and the throughput ratio those parts predict, (1 + the reference's parts over its "
        "forward) / (1 + the arm's):",
        "",
        "| | " + " | ".join(f"`{arm}`" for arm in arms[1:]) + " |",
        "|---|" + "---|" * (len(arms) - 1),
    ]
    predicted = " | ".join(cell(summary[a]["tok_s_ratio_from_parts"], False) for a in arms[1:])
    lines.append(f"| output tok/s, ratio from the parts | {predicted} |")
    for part in PARTS[1:]:
        cells = " | ".join(cell(summary[a]["over_forward"][part], True) for a in arms[1:])
        lines.append(f"| {part} | {cells} |")
    lines += ["", "## Step parts, ms per output token", "", head, rule]
    for part in PARTS:
        lines.append(f"| {part} | " + " | ".join(f"{summary[a]['step_ms_per_token'][part]:.3f}" for a in arms) + " |")
    lines += ["", "## CPU time by process, ms per output token (user + system)", "", head, rule]
    for role in roles:
        lines.append(f"| {role} | " + " | ".join(f"{summary[a]['cpu_ms_per_token'][role]:.3f}" for a in arms) + " |")
    total = {a: sum(summary[a]["cpu_ms_per_token"].values()) for a in arms}
    lines.append("| **all** | " + " | ".join(f"**{total[a]:.3f}**" for a in arms) + " |")
    lines.append("| output tok/s | " + " | ".join(f"{summary[a]['tok_s']:.0f}" for a in arms) + " |")
    lines += ["", f"Raw data: [{stem}.json]({stem}.json)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

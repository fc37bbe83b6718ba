"""`specserve bench compare`: the same load under each policy on one running server, in interleaved rounds.

Order: for each load point, round after round, every policy once per round, each round starting one
policy later than the one before (A B C, B C A, C A B, ...; two policies keep A B, A B, since B A would run
B twice in a row), so whatever drifts during the benchmark hits every policy alike, within a round as
well as between rounds, and each round is one paired observation (``stats`` says how rounds become
medians and intervals). The policy is
switched before every run and the switch is confirmed on every replica, idle, before load starts;
consecutive runs never share a spec, so each run starts with a fresh policy that learns from scratch.

Within a round every policy gets the same prompts (the prompt seed is the base seed plus the round),
and each round gets new ones. That is fair only because no run can reuse another's KV: engines cache
prompt prefixes, so every request of a run carries the run's own ``cache_salt`` (``run_cache_salt``; vLLM
hashes it into a request's first KV block, so a request hits only blocks its own run filled). Each run
starts on a prefix cache as cold as the first one's, sharing within a run (a trace's common prefixes)
still hits as in production, and no engine needs to be idle or reset between runs.

This module talks HTTP only. Switching policies needs the cluster's controller, which the cluster
side provides as a ``PolicySwitch``; running one load is a callable too, so the order and the
bookkeeping are testable without a server.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from specserve.bench import phases
from specserve.bench.load import BenchError, Plan
from specserve.bench.stats import (
    DEFAULT_RESAMPLES,
    METRICS,
    Interval,
    Metric,
    by_round,
    median_interval,
    metric_value,
    ratios_to_best,
    settled,
)

MIN_ROUNDS_FOR_CLAIMS = 5


class PolicySwitch(Protocol):
    def canonical(self, spec: str) -> str:
        """The spec as the engines will report it; raises on a spec they cannot run."""
        ...

    def model_ids(self) -> set[str]: ...

    def current(self) -> str | None:
        """The policy every replica runs now (None if they differ)."""
        ...

    def switch(self, spec: str) -> Sequence[int]:
        """Set ``spec`` on every replica; return once every replica runs it and is idle.

        Returns the engine steps run so far at each k (summed over replicas) as of a snapshot taken
        after the switch, so every step before the switch is in it.
        """
        ...


@dataclass(frozen=True, slots=True)
class LoadPoint:
    label: str  # "concurrency 4", "trace dsde-128-sharegpt"
    load: dict[str, Any]  # for the JSON
    plan: Plan


@dataclass(frozen=True, slots=True)
class Settings:
    policies: tuple[str, ...]  # as the user wrote them
    rounds: int  # rounds per point, at least
    max_rounds: int  # more rounds while the headline interval is unsettled, up to this
    headline: str | None  # the policy whose ratio decides when to stop adding rounds
    metric: Metric  # the headline metric
    ci_width: float  # stop adding rounds once the headline interval is narrower than this
    resamples: int = DEFAULT_RESAMPLES
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise BenchError(f"--rounds {self.rounds}: need at least 1")
        if self.max_rounds < self.rounds:
            raise BenchError(f"--max-rounds {self.max_rounds} is below --rounds {self.rounds}")
        if len(self.policies) < 2:
            raise BenchError(f"--policies: a comparison needs at least 2 policies, got {len(self.policies)}")
        if not fixed_rows(self.policies):
            raise BenchError("--policies: include at least one fixed:k=N, the baseline every ratio is taken to")
        if self.headline is not None and self.headline not in self.policies:
            raise BenchError(f"--headline {self.headline!r} is not among --policies")
        if not self.ci_width > 0:
            raise BenchError(f"--ci-width {self.ci_width}: must be positive")


def run_cache_salt(comparison_id: str, run_number: int) -> str:
    """The ``cache_salt`` of every request of one run: ``comparison_id`` tells comparisons on one server apart
    (a later one with the same seed sends the same prompts), ``run_number`` the runs of a comparison."""
    return f"specserve-bench-{comparison_id}-{run_number}"


def is_fixed(spec: str) -> bool:
    return spec.partition(":")[0] == "fixed"


def fixed_k(spec: str) -> int | None:
    """The k of a ``fixed:k=N`` spec, by spelling: this package talks HTTP and does not import the policy
    registry (so plain ``fixed`` gives None)."""
    return int(spec.removeprefix("fixed:k=")) if spec.startswith("fixed:k=") else None


def round_order(policies: Sequence[str], turn: int) -> list[str]:
    """The policies in the order round ``turn`` runs them: rotated by one each round, so no policy always runs
    first or last, where drift within a round would always find it. Two policies are not rotated: B A after
    A B would run B twice in a row, and a run must start from a switch."""
    if len(policies) <= 2:
        return list(policies)
    start = turn % len(policies)
    return [*policies[start:], *policies[:start]]


def fixed_rows(policies: Sequence[str]) -> list[int]:
    return [i for i, spec in enumerate(policies) if is_fixed(spec)]


def default_headline(policies: Sequence[str]) -> str | None:
    """``adaptive`` if compared, else the first policy that is not fixed."""
    if "adaptive" in policies:
        return "adaptive"
    return next((p for p in policies if not is_fixed(p)), None)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Comparison:
    """Runs the schedule; ``records`` holds one entry per run: point, round, policy, the run's report and
    the engine steps the run took at each k (which also shows that the policy in force was the one meant).

    ``final`` is the policy to leave running (default: the first compared); the switch to it closes the
    last run's step count.
    """

    points: Sequence[LoadPoint]
    settings: Settings
    switch: PolicySwitch
    run_one: Callable[[LoadPoint, int], dict[str, Any]]  # (point, round) -> a `bench run` report
    final: str | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    after_run: Callable[[], None] | None = None  # called once each run's record is complete
    _steps: Sequence[int] = ()
    _open: dict[str, Any] | None = None

    def run(self) -> list[dict[str, Any]]:
        s = self.settings
        # A snapshot proves a switch only if the spec changes (see PolicySwitch), the first one included.
        if self.switch.current() == self.switch.canonical(s.policies[0]):
            self._switch(s.policies[-1])
        turn = 0  # rounds run over every point: the order keeps rotating across points
        for point in self.points:
            for round_index in range(s.max_rounds):
                if round_index >= s.rounds and self._settled(point, round_index):
                    break
                for policy in round_order(s.policies, turn):
                    self._switch(policy)
                    report = self.run_one(point, round_index)
                    self._open = {"point": point.label, "round": round_index, "policy": policy, "report": report}
                    self.records.append(self._open)
                    self._log_run(point, round_index, policy, report)
                turn += 1
            self._log_point(point)
        last = self.switch.canonical(self.records[-1]["policy"] if self.records else s.policies[-1])
        final = (
            self.final
            if self.final not in (None, last)
            else next(p for p in s.policies if self.switch.canonical(p) != last)
        )
        self._switch(final)
        return self.records

    def _switch(self, spec: str) -> None:
        steps = list(self.switch.switch(spec))
        if self._open is not None:
            before = list(self._steps) + [0] * (len(steps) - len(self._steps))
            self._open["steps_by_k"] = [after - b for after, b in zip(steps, before, strict=False)]
            self._open = None
            if self.after_run is not None:
                self.after_run()
        self._steps = steps

    def _headline(self, point: LoadPoint) -> Interval | None:
        s = self.settings
        if s.headline is None:
            return None
        values = round_matrix(self.records, point.label, s.policies, s.metric)
        _, intervals = ratios_to_best(values, fixed_rows(s.policies), s.metric.higher_is_better, s.resamples, s.seed)
        return intervals[s.policies.index(s.headline)]

    def _settled(self, point: LoadPoint, rounds_done: int) -> bool:
        """Whether a point needs no more rounds than it has (asked once ``--rounds`` are done)."""
        interval = self._headline(point)
        if interval is None:
            return True  # nothing to settle: only fixed policies
        # Below 5 rounds a percentile interval of the median undercovers badly (with 2 rounds it is the
        # range of two ratios, which misses the true ratio half the time), so it cannot end the run.
        return rounds_done >= MIN_ROUNDS_FOR_CLAIMS and settled(interval, self.settings.ci_width)

    def _log_run(self, point: LoadPoint, round_index: int, policy: str, report: dict[str, Any]) -> None:
        r = report["requests"]
        failed = f", {r['failed']} failed" if r["failed"] else ""
        e2e = report["e2e_ms"]["mean"]
        tok_s = metric_value(report, METRICS["tok_s"])
        log(
            f"specserve bench: {point.label}  round {round_index + 1}  {policy:<24} "
            f"{tok_s:8.1f} tok/s  E2E {e2e:7.1f} ms{failed}"
        )

    def _log_point(self, point: LoadPoint) -> None:
        interval = self._headline(point)
        if interval is not None:
            s = self.settings
            log(
                f"specserve bench: {point.label}: {s.headline} / best fixed ({s.metric.label}) "
                f"{interval.value:.3f} [{interval.low:.3f}, {interval.high:.3f}]"
            )


def round_matrix(records: list[dict[str, Any]], point: str, policies: Sequence[str], metric: Metric) -> np.ndarray:
    """(policies, rounds) values of one point, over the rounds every policy completed."""
    return by_round([r for r in records if r["point"] == point], policies, lambda report: metric_value(report, metric))


#: The share of a run's engine steps ``k_mix_tok_s`` may leave unpriced (at a k no fixed policy ran that round).
K_MIX_UNPRICED_SHARE = 0.05
# A closed loop's clients all start together: until their first tokens the window counts prompts being admitted,
# not decoding. Past this share of the window (median over a point's runs) the page says the ratios measure that.
RAMP_SHARE_WARN = 0.25


def mean_k(steps_by_k: Sequence[int] | None) -> float | None:
    """The k of an average engine step in a run (None if the run's steps are unknown or none ran)."""
    if not steps_by_k or sum(steps_by_k) == 0:
        return None
    return sum(k * n for k, n in enumerate(steps_by_k)) / sum(steps_by_k)


def k_mix_tok_s(steps_by_k: Sequence[int] | None, fixed_runs: dict[int, dict[str, Any]]) -> float | None:
    """The output tok/s the fixed policies of the same round would have served in the proportions of engine
    steps a run ran at each k: each fixed run gives its tokens per step and seconds per step. Steps at a k whose
    fixed policy did not run that round are left out while they are at most ``K_MIX_UNPRICED_SHARE`` of the
    run's (a comparison that leaves out k = 0, which the policy visits for a step or two when it explores);
    with more, None."""
    if not steps_by_k or sum(steps_by_k) == 0:
        return None
    tokens = seconds = 0.0
    unpriced = 0
    for k, n in enumerate(steps_by_k):
        if n == 0:
            continue
        run = fixed_runs.get(k)
        if run is None:
            unpriced += n
            continue
        fixed_steps = sum(run.get("steps_by_k") or ())
        tok_s = metric_value(run["report"], METRICS["tok_s"])
        if fixed_steps == 0 or not tok_s:
            return None
        per_step = run["report"]["tokens"]["output"] / fixed_steps
        tokens += n * per_step
        seconds += n * per_step / tok_s
    if unpriced > K_MIX_UNPRICED_SHARE * sum(steps_by_k) or seconds == 0:
        return None
    return tokens / seconds


def k_mix_ratio(runs: list[dict[str, Any]], policy: str, best: str) -> float | None:
    """Median over rounds of ``k_mix_tok_s`` for ``policy``'s runs divided by the best fixed policy's tok/s in
    the same round: what its choice of k alone would have served, before switching and its own cost."""
    ratios = []
    for round_index in sorted({r["round"] for r in runs}):
        in_round = {r["policy"]: r for r in runs if r["round"] == round_index}
        if policy not in in_round or best not in in_round:
            continue
        fixed = {k: r for spec, r in in_round.items() if (k := fixed_k(spec)) is not None}
        mix = k_mix_tok_s(in_round[policy].get("steps_by_k"), fixed)
        if mix is not None:
            ratios.append(mix / metric_value(in_round[best]["report"], METRICS["tok_s"]))
    return float(np.median(ratios)) if ratios else None


def point_policies(document: dict[str, Any], point: dict[str, Any]) -> list[str]:
    """The policies a load point ran: its own list where comparisons were merged (``merge``), else all."""
    return list(point.get("policies") or document["policies"])


def aggregate(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Per point: each policy's medians with intervals, and its ratio to the best fixed policy per metric."""
    resamples, seed = document["settings"]["resamples"], document["settings"]["seed"]
    out = []
    for point in document["points"]:
        label = point["label"]
        policies = point_policies(document, point)
        entry: dict[str, Any] = {"label": label, "best_fixed": {}, "policies": {p: {} for p in policies}}
        for metric in METRICS.values():
            values = round_matrix(document["runs"], label, policies, metric)
            entry["rounds"] = values.shape[1]
            if values.shape[1] == 0 or np.isnan(values).any():
                continue  # a latency with no completed request: no median to report
            best, ratios = ratios_to_best(values, fixed_rows(policies), metric.higher_is_better, resamples, seed)
            entry["best_fixed"][metric.name] = policies[best]
            for row, policy in enumerate(policies):
                median = median_interval(values[row], resamples, seed)
                entry["policies"][policy][metric.name] = {
                    "median": median.value,
                    "median_low": median.low,
                    "median_high": median.high,
                    "ratio": ratios[row].value,
                    "ratio_low": ratios[row].low,
                    "ratio_high": ratios[row].high,
                }
        at_point = [r for r in document["runs"] if r["point"] == label]
        entry["ramp_share"] = ramp_share(at_point)
        best_single = entry["best_fixed"].get("tok_s")
        entry["phases"] = phases.summarize(at_point, policies, fixed_rows(policies), best_single, resamples, seed)
        for policy in policies:
            runs = [r for r in at_point if r["policy"] == policy]
            entry["policies"][policy]["failed"] = sum(r["report"]["requests"]["failed"] for r in runs)
            mean_ks = [k for r in runs if (k := mean_k(r.get("steps_by_k"))) is not None]
            entry["policies"][policy]["mean_k"] = float(np.median(mean_ks)) if mean_ks else None
            best = entry["best_fixed"].get("tok_s")
            mixed = None if is_fixed(policy) or best is None else k_mix_ratio(at_point, policy, best)
            entry["policies"][policy]["k_mix_ratio"] = mixed
        out.append(entry)
    return out


def ramp_share(runs: list[dict[str, Any]]) -> float | None:
    """Median over runs of the mean time to first token over the run's window: how much of the window the
    clients spent waiting for their first tokens (None where no run has a window and a TTFT)."""
    shares = []
    for run in runs:
        window, ttft = run["report"].get("window") or {}, run["report"].get("ttft_ms") or {}
        if window.get("s") and ttft.get("mean") is not None:
            shares.append(ttft["mean"] / 1000.0 / window["s"])
    return float(np.median(shares)) if shares else None


def _cell(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _ratio(stats: dict[str, Any] | None) -> str:
    if stats is None:
        return "-"
    return f"{stats['ratio']:.3f} [{stats['ratio_low']:.3f}, {stats['ratio_high']:.3f}]"


def order_note(document: dict[str, Any]) -> str:
    """How the runs were ordered, read from the runs themselves (results made before rounds rotated ran
    every round in the order given; a merged page may hold both)."""
    given = {p["label"]: point_policies(document, p) for p in document["points"]}
    rounds: dict[tuple[str, int], list[str]] = {}
    for run in document["runs"]:
        rounds.setdefault((run["point"], run["round"]), []).append(run["policy"])
    in_order = dict.fromkeys(given, True)
    for (point, _), order in rounds.items():
        if order != given[point][: len(order)]:
            in_order[point] = False
    as_given, rotating = (
        "in the order given (A B C A B C)",
        "each starting one policy later than the one before (A B C, B C A, C A B)",
    )
    if all(in_order.values()):
        return f"rounds interleaved {as_given}"
    if not any(in_order.values()):
        return f"rounds interleaved, {rotating}"
    listed = ", ".join(label for label, yes in in_order.items() if yes)
    return f"rounds interleaved, {rotating}, except at {listed}: {as_given}"


def markdown(document: dict[str, Any], summary: list[dict[str, Any]], headline_metric: str) -> list[str]:
    """The results page: how it was run, the headline ratios across points, one table per point."""
    s = document["settings"]
    metric = METRICS[headline_metric]
    rounds = sorted({e["rounds"] for e in summary})
    commands = document["command"] if isinstance(document["command"], list) else [document["command"]]
    lines = [
        f"# Policy comparison: {document['model']}",
        "",
        *(f"`{command}`  " for command in commands),
        "",
        f"Server {document['url']}, {document['started']}. Each load point ran every policy once per round, "
        f"{order_note(document)}, {'/'.join(map(str, rounds))} rounds per point; {document['load_note']}.",
        "",
        "A value is the median over rounds; `mean k` is the k of an average engine step in a run, counted "
        "by the engines. `× best fixed` is the median over rounds of the policy's value "
        "divided by the best fixed policy's value in the same round (the best fixed policy: the one no other "
        "fixed policy beats by that ratio, or failing that the one beaten by least); the brackets are its 95 % "
        f"bootstrap interval (rounds resampled in pairs, best fixed picked again in each resample; {s['resamples']} "
        f"resamples, seed {s['seed']}). Above 1 is better for tok/s, below 1 for latencies.",
        "",
        "`k mix` (policies that change k): the tok/s ÷ best fixed that the fixed policies of the same round "
        "would have served in the proportions of engine steps the policy ran at each k (each fixed run's tokens "
        "per step, and its tok/s), median over rounds; steps at a k no fixed policy ran are left out, up to "
        f"{K_MIX_UNPRICED_SHARE:.0%} of a run's (more: no mix). Below 1, the policy's choices of k cost that much; "
        "its own `× best fixed` below its k mix is what switching and the policy itself cost.",
    ]
    if min(rounds, default=0) < MIN_ROUNDS_FOR_CLAIMS:
        lines += ["", f"Fewer than {MIN_ROUNDS_FOR_CLAIMS} rounds: the intervals are too coarse to support a claim."]
    lines += ["", f"## {metric.label} ÷ best fixed", "", "| policy | " + " | ".join(e["label"] for e in summary) + " |"]
    lines.append("|---" * (len(summary) + 1) + "|")
    for policy in document["policies"]:
        cells = [_ratio(e["policies"].get(policy, {}).get(metric.name)) for e in summary]
        lines.append(f"| `{policy}` | " + " | ".join(cells) + " |")
    for e in summary:
        best = ", ".join(
            f"`{e['best_fixed'][m]}` by {METRICS[m].label}" for m in ("tok_s", "e2e") if m in e["best_fixed"]
        )
        lines += ["", f"## {e['label']} ({e['rounds']} rounds)", "", f"Best fixed: {best or '-'}.", ""]
        if (share := e.get("ramp_share")) is not None and share > RAMP_SHARE_WARN:
            lines += [
                f"A request's first token took {share:.0%} of the window (median over runs): that much of it the "
                "clients spent waiting for their prompts to be admitted, not decoding, so output tok/s here "
                "measures the run's ramp as much as the policies. Run longer (`--duration`) to compare them.",
                "",
            ]
        lines.append(
            "| policy | output tok/s | × best fixed | mean E2E ms | × best fixed "
            "| mean TPOT ms | mean TTFT ms | mean k | k mix | failed |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        for policy, p in e["policies"].items():

            def median(name: str, p: dict[str, Any] = p) -> float | None:
                return p[name]["median"] if name in p else None

            lines.append(
                f"| `{policy}` | {_cell(median('tok_s'))} | {_ratio(p.get('tok_s'))} | {_cell(median('e2e'))} | "
                f"{_ratio(p.get('e2e'))} | {_cell(median('tpot'), 2)} | {_cell(median('ttft'))} | "
                f"{_cell(p['mean_k'], 2)} | {_cell(p.get('k_mix_ratio'), 3)} | {p['failed']} |"
            )
        if e.get("phases"):
            lines += phases.markdown(e["phases"], list(e["policies"]))
    return lines


def require_plots() -> None:
    """Fail before any request is sent where the page's plots cannot be drawn: matplotlib is not a runtime
    dependency (it comes with the ``lab`` extra), and a comparison takes minutes to hours."""
    if importlib.util.find_spec("matplotlib") is None:
        raise BenchError(
            "the results page's plots need matplotlib, which is not installed: pip install 'specserve[lab]'"
        )


def write_results(document: dict[str, Any], prefix: Path, headline_metric: str) -> list[Path]:
    """``PREFIX.json`` (every run's report), ``PREFIX.md`` and the plots; returns the paths written."""
    require_plots()
    from specserve.bench import plots  # matplotlib: slow to import, and not a runtime dependency

    prefix.parent.mkdir(parents=True, exist_ok=True)
    json_path, md_path = prefix.with_name(prefix.name + ".json"), prefix.with_name(prefix.name + ".md")
    json_path.write_text(json.dumps(document, indent=1) + "\n")
    summary = aggregate(document)
    pngs = plots.draw(document, summary, headline_metric, prefix)
    lines = markdown(document, summary, headline_metric)
    lines += ["", *(f"![{p.stem}]({p.name})" for p in pngs)]
    md_path.write_text("\n".join(lines) + "\n")
    return [md_path, json_path, *pngs]


#: Settings that must agree for comparisons to share one page: how values were measured and summarised.
MERGE_MUST_AGREE = ("metric", "resamples", "seed", "ci_width", "ignore_eos", "temperature")


def merge(documents: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One results document from several comparisons of one model and load shape, each with its own load points
    and policies (a comparison per load, each with the fixed k that can win there): every point keeps the
    policies it ran, and its rounds are paired only with each other. ``documents``: (path, document) pairs."""
    first_path, first = documents[0]
    labels: dict[str, str] = {}
    for path, document in documents:
        for key, expected in (("model", first["model"]), ("load_note", first["load_note"])):
            if document[key] != expected:
                raise BenchError(f"{path!r}: {key} {document[key]!r} differs from {first_path!r}'s {expected!r}")
        for key in MERGE_MUST_AGREE:
            mine, theirs = document["settings"].get(key), first["settings"].get(key)
            if mine != theirs:
                raise BenchError(f"{path!r}: setting {key}={mine!r} differs from {first_path!r}'s {theirs!r}")
        for point in document["points"]:
            if point["label"] in labels:
                raise BenchError(f"{path!r}: load point {point['label']!r} is also in {labels[point['label']]!r}")
            labels[point["label"]] = path
    every = dict.fromkeys(p for _, d in documents for p in d["policies"])
    # Fixed k in order of k, then the rest as first given: the page's rows read down the k axis.
    ks = {p: k for p in every if (k := fixed_k(p)) is not None}
    fixed = sorted(ks, key=ks.__getitem__)
    starts = sorted(d["started"] for _, d in documents)
    return {
        "command": [d["command"] for _, d in documents],
        "started": " to ".join(dict.fromkeys((starts[0], starts[-1]))),
        "url": ", ".join(dict.fromkeys(d["url"] for _, d in documents)),
        "model": first["model"],
        "load_note": first["load_note"],
        "settings": {key: first["settings"].get(key) for key in MERGE_MUST_AGREE},
        "policies": [*fixed, *(p for p in every if p not in fixed)],
        "points": [{**point, "policies": point_policies(d, point)} for _, d in documents for point in d["points"]],
        "runs": [run for _, d in documents for run in d["runs"]],
    }


def read_results(path: str) -> dict[str, Any]:
    try:
        document = json.loads(Path(path).read_text())
    except OSError as exc:
        raise BenchError(f"{path!r}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise BenchError(f"{path!r}: not JSON ({exc})") from None
    if not isinstance(document, dict) or not {"policies", "points", "runs", "settings"} <= document.keys():
        raise BenchError(f"{path!r}: not a `bench compare` results file")
    return document

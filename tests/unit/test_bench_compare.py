"""`bench compare` without a server: the paired bootstrap on hand-built rounds, the interleaved order and the
step counts a fake cluster reports, rounds added until the interval settles, the pages written from a
results document, and input errors that stop the command before any load."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from specserve.bench.compare import (
    Comparison,
    LoadPoint,
    Settings,
    aggregate,
    k_mix_tok_s,
    markdown,
    mean_k,
    write_results,
)
from specserve.bench.load import BenchError, Lengths, closed_plan
from specserve.bench.stats import METRICS, median_interval, ratios_to_best, settled
from specserve.cluster.cli import main

TOK_S = METRICS["tok_s"]


def noisy(base: float, rounds: int, sd: float, seed: int) -> np.ndarray:
    return base * (1.0 + np.random.default_rng(seed).normal(0.0, sd, rounds))


# -- the bootstrap ---------------------------------------------------------------------------------------


def test_identical_policies_give_an_interval_around_one():
    values = np.array([noisy(100.0, 8, 0.03, seed=1), noisy(100.0, 8, 0.03, seed=2)])
    best, (first, second) = ratios_to_best(values, [0, 1], higher_is_better=True)
    assert first.low <= 1.0 <= first.high and second.low <= 1.0 <= second.high
    same = np.array([values[0], values[0]])
    _, (a, b) = ratios_to_best(same, [0, 1], higher_is_better=True)
    assert (a.value, a.low, a.high) == (b.value, b.low, b.high) == (1.0, 1.0, 1.0)


def test_a_clearly_better_policy_excludes_one():
    values = np.array([noisy(100.0, 5, 0.02, seed=3), noisy(130.0, 5, 0.02, seed=4)])
    best, (fixed, other) = ratios_to_best(values, [0], higher_is_better=True)
    assert best == 0 and fixed.value == 1.0
    assert other.low > 1.2 and other.excludes(1.0) and other.low <= other.value <= other.high


def test_pairing_by_round_cancels_drift_that_hits_every_policy():
    # The machine's speed drifts by half between rounds; within a round the policy is 5 % faster.
    drift = np.linspace(0.5, 1.5, 8)
    values = np.array([100.0 * drift, 105.0 * drift * (1 + np.random.default_rng(5).normal(0, 0.003, 8))])
    _, (_, faster) = ratios_to_best(values, [0], higher_is_better=True)
    assert faster.low > 1.03 and faster.high < 1.07
    # Unpaired, the same rounds say nothing: the medians' intervals overlap widely.
    assert median_interval(values[0]).high > median_interval(values[1]).low


def test_best_fixed_is_the_highest_throughput_or_the_lowest_latency():
    values = np.array([[10.0, 11.0, 10.5], [20.0, 21.0, 19.0], [15.0, 15.0, 15.0]])
    assert ratios_to_best(values, [0, 1], higher_is_better=True)[0] == 1
    assert ratios_to_best(values, [0, 1], higher_is_better=False)[0] == 0
    # Only fixed rows compete: row 2 is not a baseline even where it would be best.
    assert ratios_to_best(values, [0, 1], higher_is_better=False)[1][2].value == pytest.approx(15 / 10.5)


def test_the_best_fixed_is_the_one_ahead_within_rounds_not_the_one_with_the_higher_median_over_drift():
    # The machine slows by a third after round 4. Row 1 beats row 0 by 7 % in 6 of 8 rounds and trails it by 14 %
    # in two slow ones; row 0's median over the raw values is still the higher.
    speed = np.array([1.0, 1.0, 1.0, 1.0, 0.75, 0.75, 0.75, 0.75])
    row0 = 44.0 * speed
    row1 = row0 * np.array([1.07, 1.07, 1.07, 0.86, 1.07, 1.07, 0.86, 1.07])
    row0[3], row1[3] = 48.0, 48.0 * 0.86  # row 0's one fast run lifts its median
    values = np.array([row0, row1])
    assert np.median(values[0]) > np.median(values[1])
    best, (first, _) = ratios_to_best(values, [0, 1], higher_is_better=True)
    assert best == 1 and first.value < 1.0
    # Latencies the same way: the lower within rounds.
    assert ratios_to_best(1.0 / values, [0, 1], higher_is_better=False)[0] == 1


def test_the_bootstrap_is_seeded():
    values = np.array([noisy(100.0, 6, 0.05, seed=6), noisy(104.0, 6, 0.05, seed=7)])
    assert ratios_to_best(values, [0], True, seed=3) == ratios_to_best(values, [0], True, seed=3)


def test_settled_when_the_interval_excludes_one_or_is_narrow():
    from specserve.bench.stats import Interval

    assert settled(Interval(1.1, 1.02, 1.2), width=0.05)
    assert settled(Interval(1.0, 0.99, 1.01), width=0.05)
    assert not settled(Interval(1.0, 0.9, 1.1), width=0.05)


# -- the schedule, with a fake cluster and fake runs -----------------------------------------------------


class FakeCluster:
    """Records switches; each run adds steps at the policy's k (adaptive: half at 1, half at 3)."""

    def __init__(self, current: str | None = None) -> None:
        self.policy, self.calls, self.steps = current, [], [0] * 5

    def canonical(self, spec: str) -> str:
        return "fixed" if spec == "fixed:k=3" else spec  # as the registry shortens a default

    def model_ids(self) -> set[str]:
        return {"m"}

    def current(self) -> str | None:
        return self.policy

    def switch(self, spec: str) -> list[int]:
        self.policy = spec
        self.calls.append(("switch", spec))
        return list(self.steps)

    def run(self, point: LoadPoint, round_index: int, speed: dict[str, float]) -> dict:
        self.calls.append(("run", point.label, round_index))
        if self.policy.startswith("fixed:k="):
            self.steps[int(self.policy[-1])] += 10
        else:
            self.steps[1] += 5
            self.steps[3] += 5
        rng = np.random.default_rng(len(self.calls))
        tok_s = speed[self.policy] * (1 + rng.normal(0, 0.05))
        return {
            "requests": {"sent": 4, "completed": 4, "failed": 0},
            "tokens": {"output": tok_s},  # a run of one second
            "throughput": {"output_tokens_per_s": tok_s},
            **{m: {"mean": 1000.0 / tok_s} for m in ("e2e_ms", "tpot_ms", "ttft_ms")},
        }


def points(*concurrencies: int) -> list[LoadPoint]:
    return [
        LoadPoint(f"concurrency {c}", {"concurrency": c}, closed_plan(c, Lengths(8, 8), 4, None)) for c in concurrencies
    ]


def settings(policies, rounds=2, max_rounds=None, headline=None, ci_width=0.05) -> Settings:
    return Settings(tuple(policies), rounds, max_rounds or rounds, headline, TOK_S, ci_width, resamples=2000)


SPEED = {"fixed:k=0": 100.0, "fixed:k=2": 150.0, "adaptive": 160.0}


def test_rounds_interleave_policies_and_every_run_follows_a_confirmed_switch():
    cluster = FakeCluster(current="goodput")
    policies = ["fixed:k=0", "fixed:k=2", "adaptive"]
    run = lambda p, r: cluster.run(p, r, SPEED)  # noqa: E731
    comparison = Comparison(points(1, 4), settings(policies), cluster, run, final="goodput")
    records = comparison.run()
    runs = [(c[1], c[2]) for c in cluster.calls if c[0] == "run"]
    order = [(r["point"], r["round"], r["policy"]) for r in records]
    # Each round starts one policy later, and the rotation carries on into the next point.
    rotated = [policies, policies[1:] + policies[:1], policies[2:] + policies[:2], policies]
    expected = [(f"concurrency {c}", rnd, p) for turn, (c, rnd) in enumerate([(1, 0), (1, 1), (4, 0), (4, 1)])
                for p in rotated[turn]]  # fmt: skip
    assert order == expected and runs == [(pt, rnd) for pt, rnd, _ in expected]
    switches = [c[1] for c in cluster.calls if c[0] == "switch"]
    # One switch before each run, to the run's policy; then back to the policy the server had.
    assert switches == [p for *_, p in expected] + ["goodput"]
    calls = cluster.calls
    assert all(calls[i - 1][0] == "switch" for i, call in enumerate(calls) if call[0] == "run")
    by_policy = {r["policy"]: r["steps_by_k"] for r in records}
    assert by_policy["fixed:k=0"] == [10, 0, 0, 0, 0] and by_policy["fixed:k=2"] == [0, 0, 10, 0, 0]
    assert mean_k(by_policy["adaptive"]) == 2.0


@pytest.mark.parametrize("num_policies", [2, 3, 4])
def test_no_policy_runs_twice_in_a_row_and_each_takes_every_place_in_a_round(num_policies):
    policies = ["fixed:k=0", "fixed:k=2", "adaptive", "goodput"][:num_policies]
    cluster = FakeCluster(current="adaptive")
    speed = dict.fromkeys(policies, 100.0)
    Comparison(points(1, 4), settings(policies, rounds=3), cluster, lambda p, r: cluster.run(p, r, speed)).run()
    switches = [c[1] for c in cluster.calls if c[0] == "switch"]
    assert all(a != b for a, b in zip(switches, switches[1:], strict=False)), switches
    runs = switches[1 if switches[0] != policies[0] else 0 : -1]
    rounds = [runs[i : i + num_policies] for i in range(0, len(runs), num_policies)]
    assert all(sorted(r) == sorted(policies) for r in rounds)
    if num_policies > 2:
        places = {p: {r.index(p) for r in rounds} for p in policies}
        assert all(len(taken) == num_policies for taken in places.values()), places


@pytest.mark.parametrize(("running", "first"), [("fixed:k=0", "fixed:k=0"), ("fixed", "fixed:k=3")])
def test_the_first_switch_changes_the_spec_even_when_the_server_runs_the_first_policy(running, first):
    cluster = FakeCluster(current=running)
    speed = {first: 100.0, "adaptive": 120.0}
    Comparison(points(2), settings([first, "adaptive"], rounds=1), cluster, lambda p, r: cluster.run(p, r, speed)).run()
    switches = [c[1] for c in cluster.calls if c[0] == "switch"]
    assert switches[:3] == ["adaptive", first, "adaptive"]


def test_policies_keep_their_spelling_and_duplicates_are_refused():
    from specserve.cluster.control import CommandError, parse_policies

    assert parse_policies("fixed:k=3,goodput:k_max=4,probe_k=1,adaptive") == [
        "fixed:k=3",
        "goodput:k_max=4,probe_k=1",
        "adaptive",
    ]
    with pytest.raises(CommandError, match="'fixed:k=3' and 'fixed' are the same policy"):
        parse_policies("fixed:k=3,fixed")


def runs_made(policies, rounds, max_rounds, speed, ci_width=0.05, headline="adaptive") -> int:
    cluster = FakeCluster()
    plan = settings(policies, rounds, max_rounds, headline, ci_width)
    Comparison(points(1), plan, cluster, lambda p, r: cluster.run(p, r, speed)).run()
    return sum(c[0] == "run" for c in cluster.calls) // len(policies)


def test_rounds_are_added_until_the_headline_interval_settles():
    policies = ["fixed:k=0", "adaptive"]
    # 60 % apart: settled as soon as a claim may be made, at 5 rounds, not before.
    assert runs_made(policies, 2, 8, {"fixed:k=0": 100.0, "adaptive": 160.0}) == 5
    assert runs_made(policies, 2, 3, {"fixed:k=0": 100.0, "adaptive": 160.0}) == 3
    # A tie with 5 % noise per run: the interval contains 1 and stays wider than 0.01, so up to the maximum.
    assert runs_made(policies, 5, 9, {"fixed:k=0": 100.0, "adaptive": 100.0}, ci_width=0.01) == 9
    # Fixed policies only: no headline to settle, so --rounds it is.
    assert runs_made(["fixed:k=0", "fixed:k=2"], 2, 9, SPEED, headline=None) == 2


# -- the pages ---------------------------------------------------------------------------------------------


def document_of(records: list[dict], policies: list[str], points=("concurrency 1", "concurrency 4")) -> dict:
    return {
        "command": "specserve bench compare ...",
        "started": "today",
        "url": "http://x/v1",
        "model": "m",
        "load_note": "closed loop",
        "settings": {"resamples": 500, "seed": 0, "metric": "tok_s"},
        "policies": policies,
        "points": [{"label": label} for label in points],
        "runs": records,
    }


def test_results_page_plots_and_json_regenerate(tmp_path: Path):
    cluster = FakeCluster()
    policies = ["fixed:k=0", "fixed:k=2", "adaptive"]
    records = Comparison(points(1, 4), settings(policies, 3), cluster, lambda p, r: cluster.run(p, r, SPEED)).run()
    document = document_of(records, policies)
    summary = aggregate(document)
    assert [e["rounds"] for e in summary] == [3, 3]
    assert all(e["best_fixed"]["tok_s"] == "fixed:k=2" and e["best_fixed"]["e2e"] == "fixed:k=2" for e in summary)
    assert summary[0]["policies"]["fixed:k=2"]["mean_k"] == 2.0
    page = "\n".join(markdown(document, summary, "tok_s"))
    assert "| `adaptive` |" in page and "Fewer than 5 rounds" in page
    assert "each starting one policy later" in page, "the page says how the runs were ordered"
    # A document from before rounds rotated says so on its page.
    in_order = sorted(records, key=lambda r: (r["point"], r["round"], policies.index(r["policy"])))
    assert "in the order given" in "\n".join(markdown({**document, "runs": in_order}, summary, "tok_s"))

    paths = write_results(document, tmp_path / "out" / "cpu-test", "tok_s")
    assert {p.name for p in paths} == {
        "cpu-test.md",
        "cpu-test.json",
        "cpu-test-tok_s.png",
        "cpu-test-tok_s-ratio.png",
    }
    assert all(p.stat().st_size > 0 for p in paths)
    assert json.loads((tmp_path / "out" / "cpu-test.json").read_text())["runs"] == records
    # `bench report` makes the same page from the JSON.
    assert main(["bench", "report", str(tmp_path / "out" / "cpu-test.json"), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again.md").read_text() == (tmp_path / "out" / "cpu-test.md").read_text().replace(
        "cpu-test", "again"
    )


def test_without_matplotlib_the_commands_that_draw_fail_first_naming_the_extra(tmp_path: Path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    results = tmp_path / "missing.json"  # never read: the check comes before the input
    assert main(["bench", "report", str(results), "--out", str(tmp_path / "page")]) == 2
    assert "pip install 'specserve[lab]'" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_comparisons_of_different_loads_and_policies_merge_into_one_page(tmp_path: Path, capsys):
    # One comparison per load, each with the fixed k that can win there (as on a slow machine one would run
    # them): the merged page has both loads, each point ranked among its own policies.
    low_policies, high_policies = ["fixed:k=3", "fixed:k=4", "adaptive"], ["fixed:k=0", "fixed:k=1", "adaptive"]
    low_speed = {"fixed:k=3": 150.0, "fixed:k=4": 120.0, "adaptive": 145.0}
    high_speed = {"fixed:k=0": 100.0, "fixed:k=1": 300.0, "adaptive": 240.0}
    paths = []
    for name, pts, policies, speed in (
        ("low", points(1), low_policies, low_speed),
        ("high", points(16), high_policies, high_speed),
    ):
        cluster = FakeCluster()
        records = Comparison(pts, settings(policies, 5), cluster, lambda p, r, c=cluster, v=speed: c.run(p, r, v)).run()
        document = {**document_of(records, policies, points=[p.label for p in pts]), "command": f"compare {name}"}
        paths.append(write_results(document, tmp_path / name, "tok_s")[1])

    assert main(["bench", "report", *map(str, paths), "--out", str(tmp_path / "both")]) == 0
    merged = json.loads((tmp_path / "both.json").read_text())
    assert merged["policies"] == ["fixed:k=0", "fixed:k=1", "fixed:k=3", "fixed:k=4", "adaptive"]
    low, high = aggregate(merged)
    assert (low["best_fixed"]["tok_s"], high["best_fixed"]["tok_s"]) == ("fixed:k=3", "fixed:k=1")
    assert set(low["policies"]) == set(low_policies) and set(high["policies"]) == set(high_policies)
    assert high["policies"]["adaptive"]["tok_s"]["ratio"] == pytest.approx(240 / 300, abs=0.1)
    page = (tmp_path / "both.md").read_text()
    assert "`compare low`" in page and "`compare high`" in page
    assert "| `fixed:k=0` | - | 1" not in page and "| `fixed:k=0` | - | 0." in page, "a policy a load did not run: -"
    assert "each starting one policy later" in page and "except at" not in page
    # The merged JSON makes the same page again.
    assert main(["bench", "report", str(tmp_path / "both.json"), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again.md").read_text() == page.replace("both", "again")

    # What cannot share a page is refused, naming the file and the value.
    capsys.readouterr()
    assert main(["bench", "report", *map(str, paths)]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["bench", "report", str(paths[0]), str(paths[0]), "--out", str(tmp_path / "x")]) == 2
    assert "'concurrency 1' is also in" in capsys.readouterr().err
    other = json.loads(paths[1].read_text()) | {"model": "another"}
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert main(["bench", "report", str(paths[0]), str(tmp_path / "other.json"), "--out", str(tmp_path / "x")]) == 2
    assert "model 'another' differs" in capsys.readouterr().err
    assert not (tmp_path / "x.md").exists()

    # A point run before rounds rotated is named as such on a page that also holds rotated ones.
    high = json.loads(paths[1].read_text())
    high["runs"].sort(key=lambda r: (r["round"], high_policies.index(r["policy"])))
    (tmp_path / "in-order.json").write_text(json.dumps(high))
    assert main(["bench", "report", str(paths[0]), str(tmp_path / "in-order.json"), "--out", str(tmp_path / "y")]) == 0
    assert "except at concurrency 16: in the order given" in (tmp_path / "y.md").read_text()


def test_the_k_mix_prices_a_policys_steps_at_each_k_with_the_fixed_runs_of_its_round():
    # The fake adaptive runs 5 steps at k = 1 and 5 at k = 3; the fixed runs 10 steps of a one-second run, so
    # k = 1 makes 10 tokens a step in 0.1 s and k = 3 20 tokens in 0.1 s: the mix serves 150 tok/s, 0.75 x k = 3.
    cluster = FakeCluster()
    policies = ["fixed:k=1", "fixed:k=3", "adaptive"]
    speed = {"fixed:k=1": 100.0, "fixed:k=3": 200.0, "adaptive": 180.0}
    records = Comparison(points(4), settings(policies, 5), cluster, lambda p, r: cluster.run(p, r, speed)).run()
    (entry,) = aggregate(document_of(records, policies, points=["concurrency 4"]))
    assert entry["best_fixed"]["tok_s"] == "fixed:k=3"
    assert entry["policies"]["adaptive"]["k_mix_ratio"] == pytest.approx(0.75, abs=0.05)
    assert entry["policies"]["fixed:k=1"]["k_mix_ratio"] is None
    # Without the fixed run of a k the policy stepped at for half its steps, there is no mix to price.
    records = [r for r in records if r["policy"] != "fixed:k=1"]
    (entry,) = aggregate(document_of(records, ["fixed:k=3", "adaptive"], points=["concurrency 4"]))
    assert entry["policies"]["adaptive"]["k_mix_ratio"] is None


def test_the_k_mix_leaves_out_a_few_steps_at_a_k_no_fixed_policy_ran():
    report = {"window": None, "throughput": {"output_tokens_per_s": 200.0}, "tokens": {"output": 200}}
    fixed = {3: {"steps_by_k": [0, 0, 0, 10], "report": report}}
    # 1 step in 20 at k = 0, which no fixed policy ran: priced on the other 19, all at k = 3's rate.
    assert k_mix_tok_s([1, 0, 0, 19], fixed) == pytest.approx(200.0)
    # 2 in 20 is more than the mix may leave out.
    assert k_mix_tok_s([2, 0, 0, 18], fixed) is None


def run_report(whole: float, window: float | None, window_s: float = 10.0, ttft_ms: float = 1000.0) -> dict:
    """A run's report as `bench run` writes it: its whole rate, its window's (None: no window), 1 s latencies."""
    latency = {m: {"mean": 1000.0} for m in ("e2e_ms", "tpot_ms")}
    window_part = (
        None if window is None else {"s": window_s, "output_tokens": window_s * window, "output_tokens_per_s": window}
    )
    requests = {"sent": 4, "completed": 4, "failed": 0}
    return {
        "requests": requests,
        "throughput": {"output_tokens_per_s": whole},
        "window": window_part,
        "ttft_ms": {"mean": ttft_ms},
        **latency,
    }


def test_throughput_is_ranked_on_the_window_where_a_run_has_one():
    # A drain stretched k = 1's whole run (the one more request a client sent just before the window closed):
    # whole runs rank k = 0 first, the windows k = 1.
    runs = {"fixed:k=0": run_report(188.0, 186.0), "fixed:k=1": run_report(175.0, 192.0)}
    records = [{"point": "c", "round": r, "policy": p, "report": rep} for r in range(5) for p, rep in runs.items()]
    (entry,) = aggregate(document_of(records, list(runs), points=["c"]))
    assert entry["best_fixed"]["tok_s"] == "fixed:k=1"
    assert entry["policies"]["fixed:k=0"]["tok_s"]["ratio"] == pytest.approx(186 / 192)
    # Without windows (an open loop, or a document written before them) the whole run's rate decides.
    for report in runs.values():
        report["window"] = None
    (entry,) = aggregate(document_of(records, list(runs), points=["c"]))
    assert entry["best_fixed"]["tok_s"] == "fixed:k=0"


def test_a_window_spent_mostly_before_the_first_tokens_is_flagged_on_the_page():
    # 16 clients on a slow engine: the first tokens came 26 s into a 30 s window, so the window measures the ramp.
    def page(ttft_ms: float) -> tuple[dict, str]:
        report = run_report(10.0, 2.0, window_s=30.0, ttft_ms=ttft_ms)
        records = [{"point": "c", "round": r, "policy": "fixed:k=0", "report": report} for r in range(5)]
        document = document_of(records, ["fixed:k=0"], points=["c"])
        summary = aggregate(document)
        return summary[0], "\n".join(markdown(document, summary, "tok_s"))

    entry, slow = page(26_000.0)
    assert entry["ramp_share"] == pytest.approx(26 / 30)
    assert "first token took 87% of the window" in slow
    _, quick = page(2_000.0)
    assert "first token took" not in quick


def test_an_interrupted_round_is_left_out_of_the_statistics():
    cluster = FakeCluster()
    policies = ["fixed:k=0", "adaptive"]
    records = Comparison(points(1), settings(policies, 2), cluster, lambda p, r: cluster.run(p, r, SPEED)).run()
    document = document_of(records[:-1], policies)
    document["points"] = document["points"][:1]
    assert aggregate(document)[0]["rounds"] == 1


# -- input errors: exit status 2 and the bad value named, before any load ----------------------------------


def compare(*args: str) -> list[str]:
    return ["bench", "compare", "--url", "http://127.0.0.1:9/v1", *args]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (compare("--policies", "fixed:k=0,nope", "--concurrency", "1"), "unknown policy 'nope'"),
        (compare("--policies", "fixed:k=0,fixed:k=two", "--concurrency", "1"), "k='two'"),
        (compare("--policies", "fixed:k=3,fixed", "--concurrency", "1"), "'fixed:k=3' and 'fixed' are the same"),
        (compare("--policies", "adaptive,goodput", "--concurrency", "1"), "include at least one fixed"),
        (compare("--policies", "fixed:k=0", "--concurrency", "1"), "at least 2 policies"),
        (compare("--policies", "fixed:k=0,adaptive", "--concurrency", "1", "--headline", "bandit"), "--headline"),
        (
            compare("--policies", "fixed:k=0,adaptive", "--concurrency", "1", "--rounds", "5", "--max-rounds", "3"),
            "--max-rounds 3",
        ),
        (compare("--policies", "fixed:k=0,adaptive", "--trace", "no-such-trace"), "unknown trace 'no-such-trace'"),
        (
            compare("--policies", "fixed:k=0,adaptive", "--clients", "1:5,4:5", "--duration", "3"),
            "--duration 3: a --clients schedule sets its own length",
        ),
        (
            ["bench", "compare", "--url", "ftp://x", "--policies", "fixed:k=0,adaptive", "--concurrency", "1"],
            "--url 'ftp://x'",
        ),
    ],
)
def test_bad_input_is_a_cli_error_naming_the_value(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSERVE_STATE_DIR", str(tmp_path))  # no cluster: errors must come first anyway
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("specserve bench: ") and message in err


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--concurrency", "1,x", "'x' is not a whole number"),
        ("--concurrency", "2,0", "'0' must be at least 1"),
        ("--concurrency", "2,2", "2 appears twice"),
        ("--rounds", "0", "need at least 1 round"),
    ],
)
def test_bad_lists_and_counts_are_argument_errors(flag, value, message, capsys):
    args = compare("--policies", "fixed:k=0,adaptive", *(("--concurrency", "1") if flag != "--concurrency" else ()))
    with pytest.raises(SystemExit) as exit_:
        main([*args, flag, value])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_unreachable_url_stops_before_the_cluster_is_asked(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSERVE_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(compare("--policies", "fixed:k=0,adaptive", "--concurrency", "1", "--timeout", "2")) == 2
    assert "--url http://127.0.0.1:9/v1: cannot list models" in capsys.readouterr().err


def compare_salts(monkeypatch, tmp_path: Path, policies: str, rounds: int) -> list[str | None]:
    """Runs `bench compare` against a fake cluster and server; returns the ``cache_salt`` each run sent with."""
    import argparse

    from specserve.bench import cli, client, compare, report

    cluster, salts = FakeCluster(), []

    async def first_model(url, timeout_s):
        return "m"

    async def probe(target):
        return True, ""

    async def run(self, plan):
        salts.append(self.target.cache_salt)
        return [], 1.0

    monkeypatch.setattr(client, "first_model", first_model)
    monkeypatch.setattr(client, "probe", probe)
    monkeypatch.setattr(client.Runner, "run", run)
    summary = {
        "requests": {"sent": 2, "completed": 2, "failed": 0},
        "tokens": {"output": 100.0},
        "throughput": {"output_tokens_per_s": 100.0},
        **{m: {"mean": 10.0} for m in ("e2e_ms", "tpot_ms", "ttft_ms")},
    }
    monkeypatch.setattr(report, "summarize", lambda *args: summary)
    monkeypatch.setattr(compare, "write_results", lambda *args: [])
    backend = cli.PolicyBackend(
        parse=lambda text: text.split(","), canonical=lambda spec: spec, connect=lambda s: cluster
    )
    parser = argparse.ArgumentParser()
    cli.add_commands(parser, "bench", policies=backend)
    args = parser.parse_args(
        ["compare", "--url", "http://x/v1", "--policies", policies, "--concurrency", "1", "--num-requests", "2"]
        + ["--rounds", str(rounds), "--warmup", "0", "--out", str(tmp_path / "compare")]
    )
    assert cli.run_compare(args) == 0
    return salts


def test_every_run_of_a_comparison_sends_a_prefix_cache_salt_of_its_own(monkeypatch, tmp_path):
    # The policies of a round get the same prompts, and the engines cache prompt prefixes: a later policy would
    # reuse the KV an earlier one computed, unless each run's requests hit only blocks of their own run.
    from vllm.entrypoints.generate.base.protocol import validate_cache_salt

    first = compare_salts(monkeypatch, tmp_path, "fixed:k=0,fixed:k=2,adaptive", rounds=2)
    assert len(first) == len(set(first)) == 6
    for salt in first:
        validate_cache_salt(salt)  # what the server checks before the request reaches the engine
    # A later comparison with the same seed sends the same prompts again: its runs have salts of their own too.
    assert not set(compare_salts(monkeypatch, tmp_path, "fixed:k=0,fixed:k=2,adaptive", rounds=2)) & set(first)


def test_a_runs_salt_goes_with_each_request_and_reaches_the_servers_request(monkeypatch):
    import asyncio

    from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest, CompletionRequest

    from specserve.bench import client

    sent = []

    async def request(request_input, session):
        sent.append(request_input.extra_body)
        return client.RequestFuncOutput(success=True)

    monkeypatch.setattr(client, "async_request_openai_completions", request)
    for salt in ("specserve-bench-ab12-3", None):
        asyncio.run(client.send(None, client.Target("http://x/v1", "m", cache_salt=salt), "hello", 1, 1))
    assert sent == [{"temperature": 0.0, "cache_salt": "specserve-bench-ab12-3"}, {"temperature": 0.0}]
    # Ray Serve LLM's request models (vLLM's, which hand it to the engine) keep the field.
    completion = CompletionRequest(model="m", prompt="hello", **sent[0])
    chat = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hello"}], **sent[0])
    assert completion.cache_salt == chat.cache_salt == "specserve-bench-ab12-3"


def test_settings_reject_rounds_below_one():
    with pytest.raises(BenchError, match="--rounds 0"):
        settings(["fixed:k=0", "adaptive"], rounds=0, max_rounds=1)


@pytest.mark.parametrize(
    ("extra", "per_run"),
    [
        ([], "the whole trace per run"),
        (["--duration", "20"], "20 s of requests per run"),
        (["--num-requests", "9"], "9 requests per run"),
    ],
)
def test_a_trace_run_is_described_whatever_bounds_it(extra, per_run):
    # A trace with neither a count nor a duration replays whole; describing it once crashed the command.
    import argparse

    from specserve.bench.cli import _load_note, add_commands

    parser = argparse.ArgumentParser()
    add_commands(parser, "bench", policies=object())  # any backend: nothing is switched
    args = parser.parse_args(
        ["compare", "--url", "http://x/v1", "--policies", "fixed:k=0,adaptive", "--trace", "t.csv", *extra]
    )
    assert per_run in _load_note(args)


def schedule_report(phases: list[tuple[int, float, float]], output_tokens: float | None = None) -> dict:
    """A `--clients` run's report: each phase as (clients, seconds, output tokens) back to back, 4 requests of
    1 s latencies; ``output_tokens``, the run's whole output, where a test needs the mean output length."""
    start, shaped = 0.0, []
    for clients, seconds, tokens in phases:
        shaped.append(
            {
                "clients": clients,
                "start_s": start,
                "s": seconds,
                "output_tokens": tokens,
                "output_tokens_per_s": tokens / seconds,
            }
        )
        start += seconds
    total = sum(p["output_tokens"] for p in shaped)
    window = {"s": start, "output_tokens": total, "output_tokens_per_s": total / start, "phases": shaped}
    latency = {m: {"mean": 1000.0} for m in ("e2e_ms", "tpot_ms", "ttft_ms")}
    report = {
        "requests": {"sent": 4, "completed": 4, "failed": 0},
        "throughput": {"output_tokens_per_s": 1.0},
        "window": window,
        **latency,
    }
    if output_tokens is not None:
        report["tokens"] = {"input": 128, "output": output_tokens}
    return report


def test_a_client_schedule_is_compared_phase_by_phase_with_the_most_switching_could_gain():
    # 10 s at 1 client, where k = 3 serves best, then 10 s at 16, where k = 1 does; k = 1 is the best single k
    # (1200 tokens against 1100), and k = 3 then k = 1 would have served 300 + 1000 = 1300 tokens: 1.083 x.
    rates = {"fixed:k=1": (20.0, 100.0), "fixed:k=3": (30.0, 80.0), "adaptive": (29.0, 98.0)}

    def report(first: float, second: float) -> dict:
        return schedule_report([(1, 10.0, 10 * first), (16, 10.0, 10 * second)])

    label = "clients 1:10,16:10"
    records = [{"point": label, "round": r, "policy": p, "report": report(*rates[p])} for r in range(5) for p in rates]
    document = document_of(records, list(rates), points=[label])
    (entry,) = aggregate(document)
    assert entry["best_fixed"]["tok_s"] == "fixed:k=1"
    phases = entry["phases"]
    assert phases["best_fixed"] == ["fixed:k=3", "fixed:k=1"] and phases["best_single"] == "fixed:k=1"
    assert [i.value for i in phases["ratios"]["adaptive"]] == pytest.approx([29 / 30, 98 / 100])
    assert phases["headroom"].value == pytest.approx(1300 / 1200)
    page = "\n".join(markdown(document, [entry], "tok_s"))
    assert "| 1 client, 0-10 s | 16 clients, 10-20 s |" in page and "would have served 1.083" in page
    # A point without phases (a fixed concurrency) has no phase table.
    for r in records:
        del r["report"]["window"]["phases"]
    (entry,) = aggregate(document_of(records, list(rates), points=[label]))
    assert entry["phases"] is None


def test_a_phase_whose_clients_finish_less_than_a_request_each_is_flagged_on_the_page():
    # 48 clients for 20 s asking for 256 tokens each: if they stream 3000 tokens in the phase, a client finished
    # 3000 / 48 / 256 = 0.24 of a request there; the phase only admitted them, and their tokens came later.
    def page(high_phase_tokens: float) -> str:
        # 4 requests of 256 tokens each: a mean output of 256.
        report = schedule_report([(1, 80.0, 1200.0), (48, 20.0, high_phase_tokens)], output_tokens=4 * 256)
        label = "clients 1:80,48:20"
        records = [
            {"point": label, "round": r, "policy": p, "report": report}
            for r in range(5)
            for p in ("fixed:k=1", "fixed:k=3")
        ]
        document = document_of(records, ["fixed:k=1", "fixed:k=3"], points=[label])
        (entry,) = aggregate(document)
        assert entry["phases"]["per_client"][1] == pytest.approx(high_phase_tokens / 48 / 256)
        return "\n".join(markdown(document, [entry], "tok_s"))

    assert "The 48-client phase (20 s) is shorter than its requests: a client finished 0.24" in page(3000.0)
    # Two requests a client within the phase: its tokens answer to the policy's speed, no note.
    assert "shorter than its requests" not in page(2 * 48 * 256.0)

"""The load generator's schedules: Poisson statistics, piecewise rates, trace replay, bad input."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest

from specserve.bench.cli import add_commands, base_url, make_plan
from specserve.bench.load import BenchError, Phase, Segment, arrivals, parse_clients, parse_rate, trace_plan
from specserve.bench.prompts import WORDS, Prompter


def test_poisson_rate_statistics_with_a_seed():
    times = arrivals([Segment(math.inf, 20.0)], np.random.default_rng(7), num_requests=20_000)
    gaps = np.diff(np.concatenate([[0.0], times]))
    assert len(times) == 20_000 and np.all(gaps > 0)
    # Exponential gaps: mean 1/rate, coefficient of variation 1 (1 % tolerances are > 3 sigma here).
    assert gaps.mean() == pytest.approx(1 / 20.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)
    same = arrivals([Segment(math.inf, 20.0)], np.random.default_rng(7), num_requests=20_000)
    assert np.array_equal(times, same)


def test_poisson_count_over_a_duration():
    counts = [len(arrivals([Segment(math.inf, 10.0)], np.random.default_rng(s), duration_s=30.0)) for s in range(40)]
    assert np.mean(counts) == pytest.approx(300, rel=0.05)  # sd of the mean: sqrt(300 / 40) ~ 2.7


def test_burstiness_keeps_the_mean_and_widens_the_gaps():
    times = arrivals([Segment(math.inf, 10.0)], np.random.default_rng(1), burstiness=0.25, num_requests=20_000)
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.08)  # gamma: cv = 1 / sqrt(shape)


def test_piecewise_rates_land_in_their_segments():
    segments = parse_rate("50:10,0:5,10:10")
    assert segments == [Segment(10, 50), Segment(5, 0), Segment(10, 10)]
    times = arrivals(segments, np.random.default_rng(3))
    first, idle, last = (np.sum((times >= a) & (times < b)) for a, b in ((0, 10), (10, 15), (15, 25)))
    assert idle == 0 and times.max() < 25
    assert first == pytest.approx(500, rel=0.15) and last == pytest.approx(100, rel=0.3)


def test_stops_at_the_first_of_duration_count_and_schedule_end():
    rng = np.random.default_rng(0)
    assert len(arrivals(parse_rate("100:10"), rng, num_requests=7)) == 7
    assert arrivals(parse_rate("100:10"), rng, duration_s=2.0).max() < 2.0
    with pytest.raises(BenchError, match="needs --duration or --num-requests"):
        arrivals(parse_rate("5"), rng)


@pytest.mark.parametrize("text", ["-1", "abc", "5:0", "0", "5,2:3", "0:5"])
def test_bad_rates_name_the_value(text):
    with pytest.raises(BenchError, match=f"--rate '{text}'"):
        parse_rate(text)


def test_trace_replay_takes_times_and_lengths_from_the_file(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n2.0,30,7\n0.5,10,3\n1.0,20,5\n")
    plan = trace_plan(str(path), speed=2.0, num_requests=None, duration_s=None)
    assert plan.arrival_s.tolist() == [0.25, 0.5, 1.0]  # sorted, then divided by the speed
    assert plan.prompt_tokens.tolist() == [10, 20, 30] and plan.output_tokens.tolist() == [3, 5, 7]
    assert len(trace_plan(str(path), 1.0, num_requests=2, duration_s=None).arrival_s) == 2
    assert trace_plan(str(path), 1.0, num_requests=None, duration_s=1.5).arrival_s.tolist() == [0.5, 1.0]


def test_builtin_trace_by_name_and_unknown_trace():
    plan = trace_plan("dsde-128-sharegpt", 1.0, None, None)
    assert len(plan.arrival_s) == 128
    with pytest.raises(BenchError, match="unknown trace 'nope'"):
        trace_plan("nope", 1.0, None, None)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_commands(parser, dest="bench_command")
    return parser.parse_args(["run", "--url", "http://h:1/v1", *argv])


def test_plans_from_flags():
    closed = make_plan(parse("--concurrency", "3", "--num-requests", "5", "--input-len", "9", "--output-len", "4"))
    assert closed.arrival_s is None and closed.concurrency == 3 and closed.num_requests == 5
    assert closed.lengths(4) == (9, 4)
    assert make_plan(parse("--concurrency", "3")).num_requests == 100
    opened = make_plan(parse("--rate", "10", "--num-requests", "12"))
    assert len(opened.arrival_s) == 12 and opened.lengths(11) == (128, 64)


def test_a_range_ratio_spreads_lengths_uniformly_and_keeps_arrivals():
    argv = ("--num-requests", "4000", "--input-len", "32", "--output-len", "64")
    closed = make_plan(parse("--concurrency", "4", *argv, "--range-ratio", "0.5"))
    prompts, outputs = zip(*(closed.lengths(i) for i in range(4000)), strict=True)
    # vLLM's random dataset: integers on [floor(L (1 - R)), ceil(L (1 + R))], about uniform.
    assert (min(prompts), max(prompts), min(outputs), max(outputs)) == (16, 48, 32, 96)
    assert np.mean(outputs) == pytest.approx(64, rel=0.02) and np.std(outputs) == pytest.approx(64 / 12**0.5, rel=0.05)
    # Same seed, same lengths (every policy of a round gets them); an open loop's arrivals do not move.
    again = make_plan(parse("--concurrency", "4", *argv, "--range-ratio", "0.5"))
    assert [again.lengths(i) for i in range(50)] == [closed.lengths(i) for i in range(50)]
    spread = make_plan(parse("--rate", "10", *argv, "--range-ratio", "0.5"))
    equal = make_plan(parse("--rate", "10", *argv))
    assert np.array_equal(spread.arrival_s, equal.arrival_s) and len(set(spread.output_tokens.tolist())) > 1
    # A closed loop for a duration has no count: it cycles through more lengths than a run sends.
    timed = make_plan(parse("--concurrency", "4", "--duration", "5", "--range-ratio", "0.9"))
    assert len(timed.output_tokens) > 1000 and timed.output_tokens.min() >= 1


def test_a_client_schedule_sets_its_clients_over_time_and_its_own_length():
    plan = make_plan(parse("--clients", "1:20,16:10,0:5,2:20", "--range-ratio", "0.5"))
    assert plan.arrival_s is None and plan.concurrency == 16 and plan.num_requests is None
    assert plan.duration_s == plan.window_s == 55.0
    assert [plan.clients_at(t) for t in (0.0, 19.9, 20.0, 30.0, 36.0, 55.0)] == [
        (1, 20.0),
        (1, 20.0),
        (16, 30.0),
        (0, 35.0),
        (2, 55.0),
        (0, math.inf),
    ]
    assert len(set(plan.output_tokens.tolist())) > 1  # cycles through drawn lengths, as a timed closed loop does
    # A fixed concurrency never changes.
    assert make_plan(parse("--concurrency", "3", "--duration", "5")).clients_at(100.0) == (3, math.inf)
    assert parse_clients("4:2.5") == [Phase(4, 2.5)]


@pytest.mark.parametrize(
    "text, says",
    [
        ("4", "'4' is not N:SECONDS"),
        ("4:x", "'4:x' is not N:SECONDS"),
        ("1.5:3", "'1.5:3' is not N:SECONDS"),
        ("4:0", "need clients >= 0 and 0 < seconds < inf in '4:0'"),
        ("-1:3", "in '-1:3'"),
        ("2:inf", "in '2:inf'"),
        ("0:3,0:4", "no phase has a client"),
    ],
)
def test_bad_client_schedules_name_the_value(text, says):
    with pytest.raises(BenchError, match=f"--clients {text!r}: .*{says}".replace("(", r"\(").replace(")", r"\)")):
        parse_clients(text)


@pytest.mark.parametrize("stop", [("--duration", "5"), ("--num-requests", "8")])
def test_a_client_schedule_refuses_a_length_of_its_own(stop):
    with pytest.raises(BenchError, match=f"{stop[0]} {stop[1]}: a --clients schedule sets its own length"):
        make_plan(parse("--clients", "1:5,2:5", *stop))


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--concurrency", "2", "--range-ratio", "1"], "--range-ratio 1: must be at least 0 and below 1"),
        (["--concurrency", "2", "--range-ratio", "-0.1"], "--range-ratio -0.1"),
        (["--trace", "dsde-128-sharegpt", "--range-ratio", "0.5"], "a --trace brings its own lengths"),
    ],
)
def test_bad_range_ratios_are_errors_naming_the_value(argv, says):
    with pytest.raises(BenchError, match=says):
        make_plan(parse(*argv))


@pytest.mark.parametrize("argv", [["--rate", "-3"], ["--concurrency", "-1"], ["--concurrency", "2", "--duration", "0"]])
def test_bad_flags_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2 and argv[-1] in capsys.readouterr().err


def test_base_url():
    assert base_url("http://h:1") == "http://h:1/v1" and base_url("http://h:1/v1/") == "http://h:1/v1"
    with pytest.raises(BenchError, match="'h:1'"):
        base_url("h:1")


def test_word_prompts_have_the_requested_word_count_and_differ():
    prompter = Prompter(seed=0)
    a, b = prompter.prompt(50), prompter.prompt(50)
    assert len(a.split()) == 50 and a != b


def test_a_loads_prompts_are_what_a_closed_loop_sends_in_order_and_all_differ():
    # The in-process ways of bench/serve_overhead.py take prompts(); Runner's closed loop calls prompt() per send.
    sent = Prompter(seed=3)
    load = Prompter(seed=3).prompts(16, 20)
    assert load == [sent.prompt(20) for _ in range(16)] and len(set(load)) == 16


def test_tokenizer_prompts_have_the_exact_length(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    # A word-level tokenizer over the prompt words: every word one token, so decode/encode round-trips.
    vocab = {word: i for i, word in enumerate(["[UNK]", *dict.fromkeys(WORDS)])}
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=model, unk_token="[UNK]").save_pretrained(tmp_path)
    prompter = Prompter(seed=1, tokenizer_dir=str(tmp_path))
    for n in (1, 17, 200):
        assert len(prompter._encode(prompter.prompt(n))) == n

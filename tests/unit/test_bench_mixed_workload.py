"""The mixed workload: the same seed sends the same requests, the mix is the share asked for, the classes reach
the report, and flags that mean nothing to it are errors."""

from __future__ import annotations

import asyncio
import json

import pytest
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

from specserve.bench import client, report
from specserve.bench.cli import add_commands, run_load
from specserve.bench.load import BenchError, Lengths, closed_plan, open_plan, parse_rate
from specserve.bench.workload import BANK_PATH, COPY, FREE, MIX_BLOCK, MixedWorkload, bank, make_workload


def test_the_same_seed_sends_the_same_requests_and_another_seed_others():
    a, b = MixedWorkload(seed=7).requests(60), MixedWorkload(seed=7).requests(60)
    assert a == b
    other = MixedWorkload(seed=8).requests(60)
    assert [r.text for r in other] != [r.text for r in a]


def test_a_request_depends_on_its_index_alone_not_on_what_was_asked_before():
    # A closed loop asks in send order, an open loop all at once: request i must be the same either way.
    ordered = MixedWorkload(seed=3).requests(45)
    backwards = MixedWorkload(seed=3)
    assert [backwards.request(i) for i in reversed(range(45))][::-1] == ordered


@pytest.mark.parametrize("share", [0.0, 0.25, 0.5, 0.7, 1.0])
def test_every_block_holds_the_share_asked_for(share):
    workload = MixedWorkload(seed=1, copy_share=share)
    classes = [workload.request_class(i) for i in range(10 * MIX_BLOCK)]
    for end in range(MIX_BLOCK, len(classes) + 1, MIX_BLOCK):
        copies = classes[:end].count(COPY)
        assert abs(copies - share * end) <= 0.5
    assert set(classes) <= {COPY, FREE}


def test_the_copy_places_are_shuffled_not_a_fixed_pattern():
    workload = MixedWorkload(seed=0, copy_share=0.5)
    blocks = [tuple(workload.request_class(b * MIX_BLOCK + i) for i in range(MIX_BLOCK)) for b in range(6)]
    assert len(set(blocks)) > 1


def test_a_copy_prompt_holds_the_block_its_answer_should_repeat_and_a_free_prompt_does_not():
    workload = MixedWorkload(seed=2)
    found = {COPY: [], FREE: []}
    for request in workload.requests(40):
        found[request.request_class].append(request.text)
    blocks = [entry["block"] for entry in bank()[COPY]]
    assert found[COPY] and found[FREE]
    for text in found[COPY]:
        assert any(block in text for block in blocks)
        # It ends on the renamed opening (header, maybe a first body line), where the answer re-states the block.
        last_lines = text.splitlines()[-2:]
        assert any(line.startswith("def ") and "_copy(" in line for line in last_lines)
    for text in found[FREE]:
        assert not any(block in text for block in blocks)


def test_the_bank_is_the_committed_file():
    entries = json.loads(BANK_PATH.read_text())
    assert entries[COPY] and entries[FREE] and bank() == entries


def test_flags_that_mean_nothing_to_a_workload_are_errors():
    with pytest.raises(BenchError, match="--copy-share"):
        make_workload("random", 0, 0.5, None)
    with pytest.raises(BenchError, match="--tokenizer"):
        make_workload("mixed", 0, 0.5, "/some/tokenizer")
    with pytest.raises(BenchError, match="--copy-share 1.5"):
        make_workload("mixed", 0, 1.5, None)


class RecordingEndpoint:
    """Stands in for vLLM's request function: records the prompts and answers 8 tokens in 2 chunks for copy
    prompts, in 8 chunks otherwise."""

    def __init__(self):
        self.prompts = []

    async def send(self, http, target, prompt, prompt_len, max_tokens):
        self.prompts.append(prompt)
        chunks = 2 if "_copy" in prompt else 8
        out = RequestFuncOutput(success=True, prompt_len=prompt_len, output_tokens=8, ttft=0.01, latency=0.08)
        out.itl = [0.07 / (chunks - 1)] * (chunks - 1)
        return out, None


def run_plan(monkeypatch, plan, workload):
    endpoint = RecordingEndpoint()
    monkeypatch.setattr(client, "send", endpoint.send)
    runner = client.Runner(client.Target("http://h/v1", "m"), workload, progress=False)
    outcomes, duration_s = asyncio.run(runner.run(plan))
    return endpoint.prompts, outcomes, duration_s


def test_closed_and_open_loops_send_the_same_requests_and_the_report_splits_them_by_class(monkeypatch):
    sizes = Lengths(16, 8)
    closed, outcomes, duration_s = run_plan(monkeypatch, closed_plan(4, sizes, 40, None), MixedWorkload(5, 0.4))
    opened, _, _ = run_plan(
        monkeypatch, open_plan(parse_rate("10000"), 1.0, sizes, 0, num_requests=40), MixedWorkload(5, 0.4)
    )
    assert sorted(closed) == sorted(opened) == sorted(r.text for r in MixedWorkload(5, 0.4).requests(40))

    summary = report.summarize(outcomes, duration_s, {})
    classes = summary["classes"]
    # Two whole blocks of the mix: 40 % of 40 requests exactly.
    assert classes[COPY]["requests"]["sent"] == 16 and classes[FREE]["requests"]["sent"] == 24
    assert classes[COPY]["tokens_per_chunk"] == pytest.approx(4.0) and classes[FREE]["tokens_per_chunk"] == 1.0
    total = summary["throughput"]["output_tokens_per_s"]
    assert classes[COPY]["output_tokens_per_s"] + classes[FREE]["output_tokens_per_s"] == pytest.approx(total)
    assert all(row["class"] in (COPY, FREE) for row in report.per_request(outcomes))


def test_the_random_workload_report_has_no_classes(monkeypatch):
    from specserve.bench.prompts import Prompter

    _, outcomes, duration_s = run_plan(monkeypatch, closed_plan(2, Lengths(16, 8), 6, None), Prompter(0))
    assert "classes" not in report.summarize(outcomes, duration_s, {})


def test_bench_run_reports_the_classes_and_the_workload(monkeypatch, capsys):
    import argparse

    parser = argparse.ArgumentParser()
    add_commands(parser, "bench")
    args = parser.parse_args(
        ["run", "--url", "http://h:1", "--model", "m", "--concurrency", "2", "--num-requests", "20"]
        + ["--workload", "mixed", "--copy-share", "0.3", "--json", "--no-progress"]
    )

    async def probe(target):
        return target.ignore_eos, None

    monkeypatch.setattr(client, "probe", probe)
    monkeypatch.setattr(client, "send", RecordingEndpoint().send)
    assert run_load(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["workload"] == {"kind": "mixed", "copy_share": 0.3, "seed": 0}
    assert {name: c["requests"]["sent"] for name, c in result["classes"].items()} == {COPY: 6, FREE: 14}


VLLM_PAGE = """# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny"} 600.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="tiny"} 400.0
vllm:spec_decode_num_draft_tokens_created{engine="0",model_name="tiny"} 1.7e9
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} 300.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="tiny"} 200.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="0"} 250.0
"""


def test_the_servers_counters_are_summed_over_engines_and_differenced_over_the_run():
    from specserve.bench import server_metrics

    before = server_metrics.spec_counters(VLLM_PAGE)
    assert before == {"draft": 1000.0, "accepted": 500.0}
    # Ray Serve LLM's re-export: a ray_ prefix, the colon an underscore, no _total.
    later = VLLM_PAGE.replace("vllm:", "ray_vllm_").replace("_total{", "{").replace("600.0", "700.0")
    after = server_metrics.spec_counters(later.replace("300.0", "390.0"))
    assert server_metrics.acceptance(before, after, "u") == {
        "metrics_url": "u",
        "draft_tokens": 100.0,
        "accepted_tokens": 90.0,
        "acceptance": 0.9,
    }
    assert server_metrics.spec_counters("vllm:num_requests_running 3\n") is None
    assert "note" in server_metrics.acceptance(None, None, "u")


def test_the_table_shows_each_class_and_the_servers_acceptance(monkeypatch):
    _, outcomes, duration_s = run_plan(monkeypatch, closed_plan(2, Lengths(16, 8), 20, None), MixedWorkload(0))
    result = {"url": "u", "model": "m", "load": {"kind": "concurrency"}, **report.summarize(outcomes, duration_s, {})}
    result["speculation"] = {"draft_tokens": 100.0, "accepted_tokens": 90.0, "acceptance": 0.9}
    lines = report.table(result)
    assert any(line.startswith("acceptance  0.900 (90 of 100") for line in lines)
    rows = {line.split()[0]: line.split() for line in lines if line.split()[:1] in ([COPY], [FREE])}
    assert rows[COPY][-1] == "4.00" and rows[FREE][-1] == "1.00"

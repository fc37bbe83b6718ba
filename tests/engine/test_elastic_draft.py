"""Engine tier: offload the draft and grow the KV pool into its bytes, contract and reload, under load."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
from engine_helpers import running_engine

from specserve.models.prompts import OPENINGS
from specserve.replicas import offline
from specserve.replicas.engine_args import DraftOffload

PROMPTS = list(OPENINGS)
# Requests that arrive while the pool contracts, and decode on after the draft is back.
LATER = ["def parse(text):\n    ", "import re\n\n", "class Node:\n    def ", "if __name__ == "]
MAX_TOKENS = 160
# A pool too small for the eight requests at once (each needs two 128-token blocks by the end): vLLM preempts
# under it, and the blocks the offload adds are taken as soon as they exist.
BASELINE_BLOCKS = 12


@pytest.fixture(scope="module")
def draft_copy(trained_pair, tmp_path_factory):
    """The trained pair with its draft in a folder this module may break and mend."""
    folder = tmp_path_factory.mktemp("elastic") / "draft"
    shutil.copytree(trained_pair.draft, folder)
    return SimpleNamespace(target=trained_pair.target, draft=folder)


@pytest.fixture(scope="module")
def engine(draft_copy):
    with running_engine(draft_copy, policy="fixed:k=4", num_gpu_blocks_override=BASELINE_BLOCKS) as engine:
        yield engine


@pytest.fixture(scope="module")
def reference(engine):
    engine.set_policy("fixed:k=0")
    tokens = engine.generate(PROMPTS + LATER, max_tokens=MAX_TOKENS)
    engine.set_policy("fixed:k=4")
    return tokens


def drive(engine, actions, every_step=None):
    """Run ``PROMPTS`` at once; once the slowest of them has ``n`` tokens, call ``actions[n](add)``, where
    ``add(prompts)`` starts more requests, and ``every_step()`` after each step. Returns every request's
    tokens in the order they were added."""
    from vllm import SamplingParams

    core = engine.llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    ids: list[str] = []

    def add(prompts):
        for prompt in prompts:
            ids.append(str(len(ids)))
            core.add_request(ids[-1], prompt, params)

    add(PROMPTS)
    tokens: dict[str, list[int]] = {}
    pending = sorted(actions)
    while core.has_unfinished_requests():
        for out in core.step():
            tokens[out.request_id] = list(out.outputs[0].token_ids)
        if every_step is not None:
            every_step()
        slowest = min(len(tokens.get(str(i), [])) for i in range(len(PROMPTS)))
        while pending and slowest >= pending[0]:
            actions[pending.pop(0)](add)
    return [tokens[i] for i in ids]


def test_an_offload_reload_cycle_under_load_keeps_greedy_output_and_grows_the_pool(engine, reference):
    seen = {}

    def offload(add):
        seen["offloaded"] = offline.offload_draft(engine.llm)

    def watch():
        now = engine.telemetry()
        if now.draft_state == "offloaded":
            seen["during"] = now
            used = now.num_kv_blocks_total - now.num_kv_blocks_free
            seen["most_used"] = max(seen.get("most_used", 0), used)

    def reload(add):
        seen["reloading"] = offline.reload_draft(engine.llm)
        add(LATER)

    worker_before, before = engine.draft_pass_counts(), engine.telemetry()
    tokens = drive(engine, {8: offload, 140: reload}, every_step=watch)
    assert tokens == reference, "offload, expansion, contraction or reload changed the greedy output"
    end, memory, worker_end = engine.telemetry(), offline.draft_memory(engine.llm), engine.draft_pass_counts()

    offloaded, during, reloading = seen["offloaded"], seen["during"], seen["reloading"]
    assert offloaded["state"] == "offloaded" and during.draft_state == "offloaded"
    extra = offloaded["kv_blocks_total"] - offloaded["kv_blocks_baseline"]
    assert extra > 0 and offloaded["kv_blocks_baseline"] == BASELINE_BLOCKS
    assert during.num_kv_blocks_total == BASELINE_BLOCKS + extra
    # Past 128 tokens every request holds two blocks: they took blocks of the grown region, more than the
    # baseline pool could give.
    assert seen["most_used"] > BASELINE_BLOCKS - 1

    # While the draft was away every step ran k = 0 and skipped the draft pass, prefills too; over the run
    # the worker skipped exactly the passes the scheduler counted as skipped.
    steps_away = reloading["num_steps"] - offloaded["num_steps"]
    assert reloading["num_steps_k0"] - offloaded["num_steps_k0"] == steps_away > 0
    skipped_away = reloading["num_steps_draft_skipped"] - offloaded["num_steps_draft_skipped"]
    assert skipped_away == steps_away
    skipped = end.num_steps_draft_skipped - before.num_steps_draft_skipped
    assert worker_end["skipped"] - worker_before["skipped"] == skipped >= steps_away

    # The grown blocks were still held when the reload was asked: the pool contracted as they drained.
    assert reloading["state"] == "contracting"
    # Back to where it started: resident, the pool at its baseline, one transfer each way.
    assert memory["state"] == end.draft_state == "resident"
    assert memory["kv_blocks_total"] == end.num_kv_blocks_total == BASELINE_BLOCKS
    assert (memory["num_offloads"], memory["num_reloads"]) == (1, 1)
    assert memory["last_reload_s"] > 0
    # The reloaded draft caught the later requests up over their whole context and they drafted, accepted.
    assert end.num_requests_caught_up - during.num_requests_caught_up >= 1
    assert sum(end.num_accepted_per_pos) > sum(during.num_accepted_per_pos)


def test_offload_and_reload_refuse_the_wrong_state(engine):
    with pytest.raises(Exception, match="cannot reload the draft: it is resident"):
        offline.reload_draft(engine.llm)
    offline.offload_draft(engine.llm)
    try:
        with pytest.raises(Exception, match="cannot offload the draft: it is offloaded"):
            offline.offload_draft(engine.llm)
    finally:
        assert offline.reload_draft(engine.llm)["state"] == "resident"  # idle: drains at once


def test_a_failed_reload_leaves_speculation_off_and_serving_unharmed(engine, reference, draft_copy, tmp_path):
    offline.offload_draft(engine.llm)
    hidden = tmp_path / "hidden"
    shutil.move(draft_copy.draft, hidden)
    try:
        memory = offline.reload_draft(engine.llm)
        assert memory["state"] == "offloaded" and memory["num_reload_failures"] >= 1
        assert memory["kv_blocks_total"] > memory["kv_blocks_baseline"], "the pool grew back for the k = 0 engine"
        assert engine.generate(PROMPTS + LATER, max_tokens=MAX_TOKENS) == reference
    finally:
        shutil.move(hidden, draft_copy.draft)
    assert offline.reload_draft(engine.llm)["state"] == "resident"
    assert engine.generate(PROMPTS + LATER, max_tokens=MAX_TOKENS) == reference


@pytest.fixture(scope="module")
def triggered(draft_copy):
    """An engine whose draft moves by itself, under Nightjar's triggers (default eta and W)."""
    with running_engine(
        draft_copy, policy="fixed:k=0", num_gpu_blocks_override=BASELINE_BLOCKS, draft_offload=DraftOffload()
    ) as engine:
        yield engine


def test_the_triggers_offload_under_a_burst_at_k0_and_reload_once_it_is_over(triggered, reference):
    before = offline.draft_memory(triggered.llm)
    assert triggered.generate(PROMPTS, max_tokens=MAX_TOKENS) == reference[: len(PROMPTS)]
    after = offline.draft_memory(triggered.llm)
    # Past 128 tokens the eight requests need more blocks than the pool has: free blocks stayed below 10 % for
    # three steps at k = 0, so the draft went, once (no thrashing while the pressure lasted); as the requests
    # finished, the queue emptied and free blocks covered the draft plus a buffer for three steps, so it came
    # back after the grown blocks drained.
    events = after["events"][len(before["events"]) :]
    assert [event.split(":")[0] for event in events] == ["offloaded", "contracting", "resident"]
    assert "k = 0 and free blocks < 2 for 3 steps" in events[0]
    assert after["kv_blocks_total"] == BASELINE_BLOCKS
    # Later requests, fewer than the pool holds, decode as before with the draft back, which stays.
    assert triggered.generate(LATER, max_tokens=MAX_TOKENS) == reference[len(PROMPTS) :]
    assert offline.draft_memory(triggered.llm)["events"] == after["events"]


def test_under_a_controller_the_triggers_wait_for_its_grant(triggered, reference):
    offline.memory_coordinated(triggered.llm, True)
    seen = {}

    def watch():
        now = triggered.telemetry()
        if now.offload_wanted and not now.offload_granted and "wanted" not in seen:
            seen["wanted"] = now  # the triggers fired; nobody has granted
            seen["waited"] = triggered.telemetry()
            offline.memory_directive(triggered.llm, "grant_offload")
        if now.reload_wanted and not now.reload_granted and "reload_wanted" not in seen:
            seen["reload_wanted"] = now
            offline.memory_directive(triggered.llm, "grant_reload")

    try:
        before = offline.draft_memory(triggered.llm)
        assert drive(triggered, {}, every_step=watch) == reference[: len(PROMPTS)]
        after = offline.draft_memory(triggered.llm)
    finally:
        offline.memory_coordinated(triggered.llm, False)
    assert seen["wanted"].memory_coordinated and seen["wanted"].draft_state == "resident"
    assert seen["waited"].draft_state == "resident", "a wanted offload without a grant does not happen"
    assert "waiting for a grant" in seen["wanted"].memory_reason
    assert after["num_offloads"] == before["num_offloads"] + 1
    assert after["num_reloads"] == before["num_reloads"] + 1

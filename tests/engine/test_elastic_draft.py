"""Engine tier: offload the draft and grow the KV pool into its bytes, contract and reload, under load."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
from engine_helpers import KV_BLOCK_TOKENS, running_engine

from specserve.messages import DraftState, MemoryDecision
from specserve.models.prompts import OPENINGS
from specserve.replicas.config.engine_args import DraftOffload
from specserve.replicas.tools import offline

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
        if now.draft_state is DraftState.OFFLOADED:
            if "during" not in seen:
                seen["layout_during"] = engine.kv_layout()
            seen["during"] = now
            used = now.load.num_kv_blocks_total - now.load.num_kv_blocks_free
            seen["most_used"] = max(seen.get("most_used", 0), used)
            seen["most_resident"] = max(seen.get("most_resident", 0), engine.kv_layout()["resident_bytes"])

    def reload(add):
        seen["reloading"] = offline.reload_draft(engine.llm)
        add(LATER)

    worker_before, before, layout_before = engine.draft_pass_counts(), engine.telemetry(), engine.kv_layout()
    tokens = drive(engine, {8: offload, 140: reload}, every_step=watch)
    assert tokens == reference, "offload, expansion, contraction or reload changed the greedy output"
    end, worker_end = engine.telemetry(), engine.draft_pass_counts()

    offloaded, during, reloading = seen["offloaded"], seen["during"], seen["reloading"]
    assert offloaded["state"] == "offloaded" and during.draft_state is DraftState.OFFLOADED
    extra = offloaded["kv_blocks_total"] - offloaded["kv_blocks_baseline"]
    assert extra > 0 and offloaded["kv_blocks_baseline"] == BASELINE_BLOCKS
    assert during.load.num_kv_blocks_total == BASELINE_BLOCKS + extra
    # Past 128 tokens every request holds two blocks: they took blocks of the grown region, more than the
    # baseline pool could give.
    assert seen["most_used"] > BASELINE_BLOCKS - 1

    # The worker's KV buffer while the draft was away: the grown pool's blocks hold the target's pages only, so
    # the buffer grew by the draft's weights (to within a block), and the draft's pages of every block were lent
    # too: more blocks than the weights alone buy.
    # The drop gave the draft's bytes back to the operating system (no collection runs in the pause: the draft's
    # modules must go by reference counting alone).
    assert offloaded["last_rss_freed_bytes"] >= 0.9 * offloaded["draft_bytes"]
    layout = seen["layout_during"]
    target_block = layout["bytes_per_block"] - layout["draft_kv_bytes_per_block"]
    assert 0 < layout["draft_kv_bytes_per_block"] < layout["bytes_per_block"] == layout_before["bytes_per_block"]
    assert layout_before["buffer_bytes"] == BASELINE_BLOCKS * layout["bytes_per_block"]
    assert layout["buffer_bytes"] == (BASELINE_BLOCKS + extra) * target_block
    grown = layout["buffer_bytes"] - layout_before["buffer_bytes"]
    assert offloaded["draft_bytes"] <= grown < offloaded["draft_bytes"] + target_block
    assert extra > -(-offloaded["draft_bytes"] // layout["bytes_per_block"])
    # Grown in place: the engine's first step moved the cache into a buffer reserved for the grown pool, so the
    # offload bound wider views over the same pages, with no new buffer and no copy.
    assert layout["buffer_address"] == layout_before["buffer_address"]
    assert layout["reserved_bytes"] >= layout["buffer_bytes"] > layout_before["buffer_bytes"]

    # While the draft was away every step ran k = 0 and skipped the draft pass, prefills too; over the run
    # the worker skipped exactly the passes the scheduler counted as skipped.
    steps_away = reloading["num_steps"] - offloaded["num_steps"]
    assert reloading["num_steps_k0"] - offloaded["num_steps_k0"] == steps_away > 0
    skipped_away = reloading["num_steps_draft_skipped"] - offloaded["num_steps_draft_skipped"]
    assert skipped_away == steps_away
    skipped = end.speculation.num_steps_draft_skipped - before.speculation.num_steps_draft_skipped
    assert worker_end["skipped"] - worker_before["skipped"] == skipped >= steps_away
    # Preempted requests resume on their own cached blocks, and a reloaded draft catches everyone up: both processes
    # caught up the same requests over the same tokens (each forgets a request that enters the batch again).
    caught_up = end.speculation.num_requests_caught_up - before.speculation.num_requests_caught_up
    assert caught_up == worker_end["caught_up"] - worker_before["caught_up"] > 0
    assert (
        end.speculation.num_catch_up_tokens - before.speculation.num_catch_up_tokens
        == worker_end["catch_up_tokens"] - worker_before["catch_up_tokens"]
    )

    # Every block below the grown region was held when the reload was asked: nothing could take the grown
    # region's live blocks, so the contraction waited for them to drain.
    # The grown region still held live blocks when the reload was asked (vLLM preempts under this pool, so
    # how many varies): they moved at once to free blocks below it, or, with none free, the contraction waited.
    if reloading["state"] == "reloading":
        assert reloading["kv_blocks_total"] == BASELINE_BLOCKS and reloading["kv_blocks_live_extra"] == 0
    else:
        assert reloading["state"] == "contracting" and reloading["waiting"]
    # Back to where it started: resident, the pool at its baseline, one transfer each way.
    memory = offline.wait_for_draft(engine.llm, ("resident",))
    assert memory["kv_blocks_total"] == BASELINE_BLOCKS
    layout_after = engine.kv_layout()
    assert layout_after["buffer_bytes"] == layout_before["buffer_bytes"]  # the draft's pages are back
    assert layout_after["buffer_address"] == layout_before["buffer_address"]
    # The grown region's pages were written while the draft was away (the operating system backed more target
    # pages than the baseline pool has); the contraction gave them back: what it backs now fits in the baseline.
    assert seen["most_resident"] > BASELINE_BLOCKS * target_block
    assert layout_after["resident_bytes"] <= layout_before["buffer_bytes"]
    assert (memory["num_offloads"], memory["num_reloads"]) == (1, 1)
    assert memory["last_reload_s"] > 0
    # What the controller measures a node's reload rate from (bytes over seconds), in the engine's telemetry.
    after = engine.telemetry()
    assert (
        after.draft_memory.transfers.bytes_reloaded - before.draft_memory.transfers.bytes_reloaded
        == after.draft_memory.draft_bytes
        > 0
    )
    assert after.draft_memory.transfers.reload_s - before.draft_memory.transfers.reload_s == pytest.approx(
        memory["last_reload_s"]
    )


def test_a_reload_under_load_migrates_live_blocks_and_rebuilds_the_draft_while_steps_go_on(engine, reference):
    """The grown region holds live blocks of running requests when the reload is asked, and blocks below it
    are free to take them: they move at once (Nightjar's drain-aware contraction, §6.4)."""
    from vllm import SamplingParams

    core, tokenizer = engine.llm.llm_engine, engine.llm.get_tokenizer()
    early, early_tokens, later = PROMPTS[:5], 180, LATER[2:]
    late = []  # prompts of about 100 tokens: they need their second block soon after they start
    for prompt in LATER[:2]:
        while len(tokenizer.encode(prompt)) < 100:
            prompt += "    total = total + 1\n"
        late.append(prompt)
    engine.set_policy("fixed:k=0")
    longer = dict(zip(early, engine.generate(early, max_tokens=early_tokens), strict=True))
    longer.update(zip(late, engine.generate(late, max_tokens=MAX_TOKENS), strict=True))
    engine.set_policy("fixed:k=4")
    tokens: dict[str, list[int]] = {}
    order: list[tuple[str, int]] = []
    seen: dict = {}

    def add(prompts, max_tokens):
        for prompt in prompts:
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
            core.add_request(str(len(order)), prompt, params)
            order.append((prompt, max_tokens))

    # The engine steps on its own, ahead of this loop: the decisions read the engine's state.
    add(early, early_tokens)
    while core.has_unfinished_requests():
        for out in core.step():
            tokens[out.request_id] = list(out.outputs[0].token_ids)
        memory = offline.draft_memory(engine.llm)
        early_done = all(len(tokens.get(str(i), [])) == early_tokens for i in range(len(early)))
        if "offloaded" not in seen and memory["kv_blocks_total"] - memory["kv_blocks_free"] > 2 * len(early):
            # Every early request holds its two blocks: 10 of the 11 below the region (and the null block). The
            # late requests' blocks come from the grown region, the second ones while the early still run.
            seen["offloaded"] = offline.offload_draft(engine.llm)
            add(late, MAX_TOKENS)
        elif "offloaded" in seen and "reloading" not in seen and early_done and memory["kv_blocks_live_extra"] >= 1:
            seen["before"] = memory
            seen["reloading"] = offline.reload_draft(engine.llm)
            seen["away"] = engine.telemetry()  # nothing catches up or drafts before the draft is back
            add(later, MAX_TOKENS)  # busy while the draft is rebuilt; it catches them up once back
        elif "reloading" in seen and "resident" not in seen and memory["state"] == "resident":
            seen["resident"] = memory
    end = engine.telemetry()

    by_prompt = {**dict(zip(PROMPTS + LATER, reference, strict=True)), **longer}
    expected = [by_prompt[prompt][:max_tokens] for prompt, max_tokens in order]
    assert [tokens[str(i)] for i in range(len(expected))] == expected
    before, reloading = seen["before"], seen["reloading"]
    # The live blocks moved below the region in the reload call itself (a step may have run between the two
    # reads; the late requests hold their grown blocks to the end); the pool was cut there and then.
    # One block at least: how many of the late requests' blocks land in the region depends on how far the engine
    # core, stepping in its own process, ran ahead of this loop when the offload was asked (two on the AMX and
    # AVX-512 machines, one on an AVX2-only one).
    assert reloading["blocks_migrated"] - before["blocks_migrated"] >= before["kv_blocks_live_extra"] >= 1
    assert reloading["state"] == "reloading" and reloading["kv_blocks_total"] == BASELINE_BLOCKS
    # The draft was rebuilt while the engine went on stepping, every step at k = 0 without a draft pass.
    resident, away = seen["resident"], seen["away"]
    assert resident["last_reload_steps"] > 0
    assert resident["last_reload_steps_k0"] == resident["last_reload_steps"]
    # Back, the draft caught the running requests up over their whole context, and they drafted, accepted.
    assert end.speculation.num_requests_caught_up > away.speculation.num_requests_caught_up
    assert sum(end.speculation.num_accepted_per_pos) > sum(away.speculation.num_accepted_per_pos)


def test_offload_and_reload_refuse_the_wrong_state(engine):
    with pytest.raises(Exception, match="cannot reload the draft: it is resident"):
        offline.reload_draft(engine.llm)
    offline.offload_draft(engine.llm)
    try:
        with pytest.raises(Exception, match="cannot offload the draft: it is offloaded"):
            offline.offload_draft(engine.llm)
    finally:
        assert offline.reload_draft(engine.llm)["state"] == "reloading"  # idle: nothing to drain or move
        offline.wait_for_draft(engine.llm, ("resident",))


def test_a_failed_reload_leaves_speculation_off_and_serving_unharmed(engine, reference, draft_copy, tmp_path):
    offline.offload_draft(engine.llm)
    hidden = tmp_path / "hidden"
    shutil.move(draft_copy.draft, hidden)
    try:
        offline.reload_draft(engine.llm)
        memory = offline.wait_for_draft(engine.llm, ("offloaded", "resident"))
        assert memory["state"] == "offloaded" and memory["num_reload_failures"] >= 1
        assert memory["kv_blocks_total"] > memory["kv_blocks_baseline"], "the pool grew back for the k = 0 engine"
        assert engine.generate(PROMPTS + LATER, max_tokens=MAX_TOKENS) == reference
    finally:
        shutil.move(hidden, draft_copy.draft)
    offline.reload_draft(engine.llm)
    assert offline.wait_for_draft(engine.llm, ("offloaded", "resident"))["state"] == "resident"
    assert engine.generate(PROMPTS + LATER, max_tokens=MAX_TOKENS) == reference


def test_requests_preempted_at_k4_resume_on_their_cached_blocks_caught_up_alike_by_both_processes(engine):
    """Prompts of a whole block and more, too many for this pool: vLLM preempts, and a preempted request resumes at
    a prefix-cache hit on its first block (freed last, so it outlives the blocks the preemption handed over). Both
    processes forget a request that enters the batch again and catch it up over its cached prefix. A scheduler that
    kept its old complete prefix counted no catch-up at all while the worker, which had forgotten the request when
    it left its batch, caught it up (measured: 0 requests against the worker's 8)."""
    tokenizer = engine.llm.get_tokenizer()
    prompts = []
    for opening in PROMPTS:
        prompt = opening
        while len(tokenizer.encode(prompt)) < KV_BLOCK_TOKENS + 16:
            prompt += "    total = total + 1\n"
        prompts.append(prompt)
    plain = engine.cold_turn("fixed:k=0", prompts, 160)
    counters = engine.vllm_counters()
    run = engine.cold_turn("fixed:k=4", prompts, 160)
    assert engine.vllm_counters()["vllm:num_preemptions"].value > counters["vllm:num_preemptions"].value
    assert run.tokens == plain.tokens
    # At k = 4 no pass is skipped: the only lag is a resumed request's cached prefix, whole blocks of it.
    assert run.caught_up == run.worker_caught_up > 0
    assert run.catch_up_tokens == run.worker_catch_up_tokens
    assert run.catch_up_tokens % KV_BLOCK_TOKENS == 0 and run.catch_up_tokens > 0


def test_a_prefix_hit_on_blocks_filled_while_the_draft_was_away_is_caught_up(engine):
    """A first turn decoded while the draft was offloaded: its blocks hold no draft KV (the draft's pages were lent
    to the pool, and laid out again zeroed at the reload). Its second turn, after the reload, starts on those blocks;
    its cached prefix counts as draft lag and is caught up, so it decodes as plain decoding does and speculates as
    a second turn that hit nothing."""
    assert engine.llm.reset_prefix_cache()
    offline.offload_draft(engine.llm)
    first = engine.turn(PROMPTS[:2], 280)  # two whole blocks each and part of a third
    assert offline.reload_draft(engine.llm)["state"] == "reloading"  # idle: nothing to drain or move
    offline.wait_for_draft(engine.llm, ("resident",))
    second = engine.next_turn(first)
    engine.set_policy("fixed:k=4")
    hit = engine.turn(second, 96)
    assert hit.num_cached_tokens == [2 * KV_BLOCK_TOKENS] * 2
    assert hit.caught_up == hit.worker_caught_up == 2
    assert hit.catch_up_tokens == hit.worker_catch_up_tokens == 4 * KV_BLOCK_TOKENS
    plain = engine.cold_turn("fixed:k=0", second, 96)
    cold = engine.cold_turn("fixed:k=4", second, 96)
    assert hit.tokens == plain.tokens == cold.tokens
    # Drafting on the zeroed draft KV as if it were complete: 0.46 against 0.52 at the first position.
    assert cold.acceptance()[0] > 0.3
    for pos, (ours, base) in enumerate(zip(hit.acceptance(), cold.acceptance(), strict=True)):
        assert ours == pytest.approx(base, abs=0.05), f"position {pos}: {ours:.3f} after the hit vs {base:.3f} cold"


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
    after = offline.wait_for_draft(triggered.llm, ("resident",))
    # Past 128 tokens the eight requests need more blocks than the pool has: free blocks stayed below 10 % for
    # three steps at k = 0, so the draft went, once (no thrashing while the pressure lasted); as the requests
    # finished, the queue emptied and free blocks covered the draft plus a buffer for three steps, so it came
    # back once few enough of the grown blocks were live to move them.
    events = after["events"][len(before["events"]) :]
    assert [event.split(":")[0] for event in events] == ["offloaded", "contracting", "reloading", "resident"]
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
        if now.draft_memory.offload_wanted and not now.draft_memory.offload_granted and "wanted" not in seen:
            seen["wanted"] = now  # the triggers fired; nobody has granted
            seen["waited"] = triggered.telemetry()
            offline.memory_directive(triggered.llm, MemoryDecision.GRANT_OFFLOAD)
        if now.draft_memory.reload_wanted and not now.draft_memory.reload_granted and "reload_wanted" not in seen:
            seen["reload_wanted"] = now
            offline.memory_directive(triggered.llm, MemoryDecision.GRANT_RELOAD)

    try:
        before = offline.draft_memory(triggered.llm)
        assert drive(triggered, {}, every_step=watch) == reference[: len(PROMPTS)]
        after = offline.wait_for_draft(triggered.llm, ("resident",))
    finally:
        offline.memory_coordinated(triggered.llm, False)
    assert seen["wanted"].draft_memory.coordinated and seen["wanted"].draft_state is DraftState.RESIDENT
    assert seen["waited"].draft_state is DraftState.RESIDENT, "a wanted offload without a grant does not happen"
    assert "waiting for a grant" in seen["wanted"].draft_memory.reason
    assert after["num_offloads"] == before["num_offloads"] + 1
    assert after["num_reloads"] == before["num_reloads"] + 1

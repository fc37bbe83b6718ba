"""The real engine announces prefill as the simulator does (both call speculation.context), and logs every step's
context and record so that a policy's decisions replay offline exactly (``step_log``)."""

from __future__ import annotations

from itertools import pairwise

from engine_helpers import PROMPTS, running_engine


def test_an_offline_batch_at_max_num_seqs_announces_each_prompt_once(trained_pair, capfd):
    # Eight requests for two seats, all submitted at once. While both seats decode, the queue's prompts
    # cannot join a step, so the contexts announce them only on the steps that admit them: over the run the
    # announced prefill adds up to the prompts. Counting the whole queue announced it on every step.
    from vllm import SamplingParams

    prompts = [PROMPTS[i % len(PROMPTS)] + f"x{i} = " for i in range(8)]
    with running_engine(trained_pair, policy="fixed:k=2", max_num_seqs=2) as engine:
        engine.set_policy("fixed:k=0")
        before = engine.telemetry()
        params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
        outputs = engine.llm.generate(prompts, params, use_tqdm=False)
        after = engine.telemetry()
    # On an engine started for this test (the shared one's start is over before any test): vLLM configures a
    # handler for its own logger only, and specserve's engine-side lines go through it.
    out, err = capfd.readouterr()
    log = out + err
    assert "specserve: method draft_model, policy fixed:k=2, max_k 4, k = 0: skip, catch up on resume" in log
    assert "specserve: warmed decode row counts 1-10" in log  # 2 seats x (max_k + 1)
    assert "specserve: policy set to fixed:k=0" in log
    prompt_tokens = sum(len(output.prompt_token_ids) for output in outputs)
    announced = after.speculation.num_prefill_tokens_announced - before.speculation.num_prefill_tokens_announced
    steps = after.speculation.num_steps - before.speculation.num_steps
    assert steps >= 4 * 24, "two seats at a time: at least four rounds of 24 decode steps"
    assert announced == prompt_tokens


def test_the_step_log_replays_every_k_the_engine_chose(shared_engine):
    from lab.experiments.policy_replay import replay_run, runs

    engine = shared_engine
    first = engine.telemetry().speculation.num_steps
    # A k = 0 stretch of its own: whether adaptive goes to k = 0 depends on what the shared engine ran before.
    engine.set_policy("fixed:k=0")
    engine.generate(max_tokens=8)
    engine.set_policy("fixed:k=1")
    engine.generate(max_tokens=16)
    engine.set_policy("adaptive")  # warm-started on every step the engine ran, other tests' included
    engine.generate(max_tokens=192)
    num_steps = engine.telemetry().speculation.num_steps
    steps = engine.logged_steps()
    assert len(steps) == num_steps, "one line per step, none torn"
    ours = [(start, stop) for start, stop in runs(steps) if stop > first]
    assert [steps[a].policy for a, _ in ours] == ["fixed:k=0", "fixed:k=1", "adaptive"]
    start, stop = ours[2]
    replay = replay_run(steps, start, stop)
    assert replay.num_steps > 30
    assert replay.num_agreeing == replay.num_steps
    # Each step's parts, timed in the worker: a step that skipped the draft spent nothing in it.
    records = [s.record for s in steps[first:]]
    assert all(r.forward_s is not None and r.draft_s is not None for r in records)
    assert all(0 < r.forward_s and r.forward_s + r.draft_s < r.duration_s for r in records)
    assert {r.draft_s > 0 for r in records if r.num_draft_passes == 0} == {False}
    assert {r.draft_s > 0 for r in records if r.num_draft_passes > 0} == {True}


def test_a_busy_step_is_timed_from_the_previous_steps_end_and_an_idle_gap_is_no_steps_cost(shared_engine):
    # Back to back, a step runs from the previous step's end, so the loop's own work between steps counts (the
    # simulator's fitted step times include it): a batch's durations add up to its wall time. A step after an
    # idle engine starts at its own schedule, so the idle time is nobody's cost.
    import time

    engine = shared_engine
    idle_s = 1.0
    engine.set_policy("fixed:k=2")
    first = engine.telemetry().speculation.num_steps
    time.sleep(idle_s)
    engine.generate(max_tokens=32)
    num_first = engine.telemetry().speculation.num_steps - first
    time.sleep(idle_s)
    engine.generate(max_tokens=32)
    records = [step.record for step in engine.logged_steps()[first:]]
    for batch in (records[:num_first], records[num_first:]):
        assert len(batch) > 10
        span_s = batch[-1].now_s - batch[0].now_s  # first schedule to last schedule
        before_last_s = sum(r.duration_s for r in batch[:-1])
        assert before_last_s <= span_s <= before_last_s + batch[-1].duration_s
    assert records[0].duration_s < idle_s / 2 and records[num_first].duration_s < idle_s / 2


def test_a_step_verifies_what_the_step_before_drafted_cut_to_its_own_k(shared_engine):
    # vLLM drafts at the end of a step for the next, and the scheduler cuts those drafts to the next step's k: the
    # simulator's ``drafts_ahead``, which policies read as ``EngineTraits.drafts_ahead``. Under k = 1, 3, 3, 1, ...
    # the first k = 3 step verifies the one draft made before it, the second verifies three, each runs three passes.
    engine = shared_engine
    engine.set_policy("cycle:ks=1-3-3")
    first = engine.telemetry().speculation.num_steps
    engine.generate(max_tokens=96)
    steps = engine.logged_steps()[first:]
    assert all(s.traits.drafts_ahead for s in steps)
    records = [s.record for s in steps]
    deepest: dict[tuple[int, int], int] = {}
    for before, record in pairwise(records):
        key = (before.k, record.k)
        deepest[key] = max(deepest.get(key, 0), max(record.num_drafted_per_request, default=0))
    assert deepest[(1, 3)] == 1, "a rise verifies only the drafts made before it"
    assert deepest[(3, 3)] == 3
    assert deepest[(3, 1)] == 1, "a fall cuts the drafts made for it"
    decodes = [r for r in records if r.num_batched_tokens == r.num_running + r.num_drafted]
    assert {r.num_draft_passes for r in decodes if r.k == 3} == {3}
    # The worker timed the draft's passes: three take longer than one.
    draft_s = {k: sorted(r.draft_s for r in decodes if r.k == k and r.draft_s is not None) for k in (1, 3)}
    assert draft_s[1] and draft_s[3] and draft_s[3][len(draft_s[3]) // 2] > draft_s[1][len(draft_s[1]) // 2]


def test_on_a_nearly_full_pool_the_context_counts_the_blocks_vllm_then_allocates(trained_pair, tmp_path):
    # A 32-token block pool too small for eight requests. Between two steps that run the same requests, vLLM's free
    # blocks fall by what the first step allocated: the context's count for the k it ran (its drafts and vLLM's
    # lookahead slots). `adaptive` then never runs a k whose blocks do not fit.
    from specserve.speculation import step_log

    path = tmp_path / "steps.jsonl"
    prompts = [PROMPTS[i % len(PROMPTS)] + f"x{i} = " for i in range(8)]
    pool = dict(num_gpu_blocks_override=12, block_size=32, max_model_len=128)
    with running_engine(trained_pair, policy="fixed:k=0", step_log=str(path), **pool) as engine:
        reference = engine.generate(prompts, max_tokens=64)
        for policy in ("fixed:k=3", "adaptive"):
            engine.set_policy(policy)
            assert engine.generate(prompts, max_tokens=64) == reference, f"{policy} changed the greedy output"
    with path.open() as f:
        steps = list(step_log.read(f))
    checked = 0
    for step, after in pairwise(steps):
        ctx, record = step.ctx, step.record
        if (
            step.policy.startswith("fixed")
            and record.k == 3
            and ctx.kv_blocks_needed
            and ctx.num_prefill_tokens == 0
            and after.ctx.request_ids == ctx.request_ids
        ):
            assert after.ctx.num_kv_blocks_free == ctx.num_kv_blocks_free - ctx.kv_blocks_needed[record.k]
            checked += 1
    assert checked >= 5, "the pool ran short on steady decode steps"
    tight = [step for step in steps if step.policy.startswith("adaptive") and step.ctx.kv_blocks_needed]
    assert tight, "adaptive met a short pool"
    for step in tight:
        needed = step.ctx.kv_blocks_needed
        assert needed[step.record.k] <= max(step.ctx.num_kv_blocks_free, needed[0])

"""Engine tier: every method specserve controls, under its own k = 0 (``specserve.speculation.methods``). MTP, whose
k = 0 is the heads' rule, runs in the serve tier (``tests/serve/test_methods_served.py``) and under vLLM's own
``mtp`` in ``test_eagle3_head.py``.

n-gram lookup skips its proposer at k = 0 and has nothing to catch up; an EAGLE-3 head runs its one sync pass at
k = 0 (its KV needs the target's hidden states of every position). Each is lossless through k = 0 stretches and
resumption, against plain decoding of the same target.
"""

from __future__ import annotations

import pytest
from engine_helpers import PROMPTS, running_engine

from specserve.bench.workload import COPY, FREE, MixedWorkload
from specserve.models.prompts import OPENINGS
from specserve.speculation import methods

# Prompts whose greedy continuation repeats their own spans, so that a lookup finds matches.
COPYING = [" ".join([OPENINGS[i]] * 4) for i in range(4)]
CYCLE = "cycle:ks=4-4-0-0-0-0-0-0-4-4-4-4"


@pytest.fixture(scope="module")
def ngram(trained_pair):
    with running_engine(trained_pair, policy="fixed:k=0", method="ngram") as engine:
        yield engine


@pytest.mark.parametrize("policy", ["fixed:k=4", CYCLE, "adaptive"])
def test_ngram_is_lossless_under_every_policy(ngram, policy):
    ngram.set_policy("fixed:k=0")
    prompts = COPYING + PROMPTS[:2]
    reference = ngram.generate(prompts, max_tokens=48)
    ngram.set_policy(policy)
    assert ngram.generate(prompts, max_tokens=48) == reference


def test_ngram_k0_skips_the_lookup_and_catches_nothing_up(ngram):
    ngram.set_policy(CYCLE)
    before, worker_before = ngram.telemetry(), ngram.draft_pass_counts()
    ngram.generate(COPYING, max_tokens=48)
    after, worker_after = ngram.telemetry(), ngram.draft_pass_counts()
    skipped = after.speculation.num_steps_draft_skipped - before.speculation.num_steps_draft_skipped
    assert skipped > 0 and worker_after["skipped"] - worker_before["skipped"] == skipped
    # A lookup keeps no per-request state: nothing lags after a k = 0 stretch, and no draft is cut for lag.
    assert worker_after["caught_up"] == worker_before["caught_up"]
    assert after.speculation.num_requests_caught_up == before.speculation.num_requests_caught_up
    assert after.speculation.num_drafts_cut_for_lag == before.speculation.num_drafts_cut_for_lag
    drafted = sum(after.speculation.num_drafted_per_pos) - sum(before.speculation.num_drafted_per_pos)
    accepted = sum(after.speculation.num_accepted_per_pos) - sum(before.speculation.num_accepted_per_pos)
    assert drafted > 0 and accepted > 0
    # A lookup may find fewer than k tokens, never more: the start-up check's count stays clean.
    assert worker_after["proposals_not_k"] == worker_before["proposals_not_k"]


def test_ngram_accepts_more_on_the_mixed_workloads_copy_requests_than_on_its_free_form_ones(ngram):
    """The mixed workload does what it is for (``specserve bench --workload mixed``): the copy requests' lookups are
    accepted more often than the free-form ones', each class measured alone from the scheduler's counts."""
    from vllm import SamplingParams

    prompts: dict[str, list[str]] = {COPY: [], FREE: []}
    for request in MixedWorkload(seed=0, copy_share=0.5).requests(20):
        prompts[request.request_class].append(request.text)
    assert prompts[COPY] and prompts[FREE]
    ngram.set_policy("fixed:k=4")
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    measured = {}
    for name, texts in prompts.items():
        before = ngram.telemetry().speculation
        answers = [o.outputs[0].text for o in ngram.llm.generate(texts, params, use_tqdm=False)]
        after = ngram.telemetry().speculation
        drafted = sum(after.num_drafted_per_pos) - sum(before.num_drafted_per_pos)
        accepted = sum(after.num_accepted_per_pos) - sum(before.num_accepted_per_pos)
        # Both classes drafted: the comparison is between two measured rates, not against an empty class.
        assert drafted > 0, name
        repeated = sum(answer in prompt for answer, prompt in zip(answers, texts, strict=True))
        measured[name] = {"acceptance": accepted / drafted, "answers_found_in_prompt": repeated}
    assert measured[COPY]["acceptance"] > measured[FREE]["acceptance"], measured
    # The copy answers re-state their prompts' blocks: the reason their drafts are accepted.
    assert measured[COPY]["answers_found_in_prompt"] > measured[FREE]["answers_found_in_prompt"], measured


def test_ngram_telemetry_names_its_method_and_k0(ngram):
    t = ngram.telemetry()
    assert t.policy.method == "ngram"
    assert t.policy.k0 == "skip, nothing to catch up"


@pytest.fixture(scope="module")
def eagle3(trained_pair):
    from specserve.models.cache import cached_head

    head = str(cached_head("eagle3", progress=False))
    with running_engine(trained_pair, policy="fixed:k=0", method="eagle3", draft=head, max_k=3) as engine:
        yield engine


@pytest.mark.parametrize("policy", ["fixed:k=3", "cycle:ks=3-3-0-0-0-0-0-0-3-3-3-3", "adaptive"])
def test_eagle3_is_lossless_under_every_policy(eagle3, policy):
    eagle3.set_policy("fixed:k=0")
    reference = eagle3.generate(max_tokens=48)
    eagle3.set_policy(policy)
    assert eagle3.generate(max_tokens=48) == reference


def test_eagle3_k0_runs_the_heads_pass_and_resumes_at_full_acceptance(eagle3):
    assert eagle3.telemetry().policy.k0 == methods.method("eagle3").k0.value
    eagle3.set_policy("fixed:k=0")
    before, worker_before = eagle3.telemetry(), eagle3.draft_pass_counts()
    eagle3.generate(max_tokens=24)
    after, worker_after = eagle3.telemetry(), eagle3.draft_pass_counts()
    # The head's sync pass ran on every step: nothing skipped, on either side.
    assert after.speculation.num_steps_draft_skipped == before.speculation.num_steps_draft_skipped
    assert worker_after["skipped"] == worker_before["skipped"]
    assert worker_after["ran"] - worker_before["ran"] == after.speculation.num_steps - before.speculation.num_steps

    def first_position_acceptance(policy: str) -> float:
        eagle3.set_policy(policy)
        b = eagle3.telemetry().speculation
        eagle3.generate(max_tokens=64)
        a = eagle3.telemetry().speculation
        return (a.num_accepted_per_pos[0] - b.num_accepted_per_pos[0]) / (
            a.num_reached_per_pos[0] - b.num_reached_per_pos[0]
        )

    # Its KV kept whole through k = 0 stretches, the head drafts after a resumption as it does at steady k.
    steady = first_position_acceptance("fixed:k=3")
    resumed = first_position_acceptance("cycle:ks=3-3-0-0-0-0-0-0-3-3-3-3")
    assert resumed == pytest.approx(steady, abs=0.1)

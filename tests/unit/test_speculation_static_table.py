"""StaticTablePolicy: vLLM's Dynamic SD batch-size -> k table (vLLM PR #32374).

Worked example: vLLM's docs table [[1,16,5],[17,32,4],[33,64,3],[65,128,1],[129,512,0]] (our default)
gives batch 16 -> 5, 17 -> 4, 64 -> 3, 65 -> 1, 129 -> 0; TensorRT-LLM's {4:4, 8:2, 32:1} gives 33+ -> 0.
"""

from __future__ import annotations

import pytest

from specserve.speculation import EngineTraits, StaticTablePolicy, StepContext, make_policy
from specserve.speculation.policies.static_table import DEFAULT_TABLE, parse_table


def context(num_running: int, draft_resident: bool = True) -> StepContext:
    return StepContext(
        now_s=0.0,
        num_running=num_running,
        num_waiting=0,
        num_context_tokens=100 * num_running,
        draft_resident=draft_resident,
    )


def test_default_is_vllms_docs_example() -> None:
    assert [(r.first, r.last, r.k) for r in parse_table(DEFAULT_TABLE)] == [
        (1, 16, 5),
        (17, 32, 4),
        (33, 64, 3),
        (65, 128, 1),
        (129, 512, 0),
    ]


@pytest.mark.parametrize(
    ("num_running", "k"),
    [
        (1, 5),
        (16, 5),
        (17, 4),
        (32, 4),
        (33, 3),
        (64, 3),
        (65, 1),
        (128, 1),
        (129, 0),
        (512, 0),
        (513, 0),  # past the table: no speculation
        (0, 0),  # nothing decodes
    ],
)
def test_range_edges(num_running: int, k: int) -> None:
    policy = make_policy("static-table", EngineTraits(max_k=5))
    assert isinstance(policy, StaticTablePolicy)
    assert policy.choose(context(num_running)).k == k


def test_entries_above_max_k_are_capped() -> None:
    policy = make_policy("static-table", EngineTraits(max_k=3))
    assert [policy.choose(context(b)).k for b in (1, 16, 17, 33, 65, 129)] == [3, 3, 3, 3, 1, 0]


def test_trt_llm_schedule_and_beyond_the_table() -> None:
    policy = make_policy("static-table:table=1-4:4/5-8:2/9-32:1", EngineTraits(max_k=4))
    assert [policy.choose(context(b)).k for b in (1, 4, 5, 8, 9, 32, 33, 1000)] == [4, 4, 2, 2, 1, 1, 0, 0]


def test_zero_while_the_draft_is_away() -> None:
    policy = make_policy("static-table", EngineTraits(max_k=5))
    assert policy.choose(context(4, draft_resident=False)).k == 0


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ("2-16:5", "'2-16:5'.*start at batch size 1"),
        ("1-16:5/18-32:4", "'18-32:4'.*continue at 17"),  # gap
        ("1-16:5/16-32:4", "'16-32:4'.*continue at 17"),  # overlap
        ("1-16:5/17-32:x", "'17-32:x'"),
        ("1-16", "'1-16'"),
        ("1:5", "'1:5'"),
        ("16-1:3", "'16-1:3'"),
        ("1-16:-1", "'1-16:-1'"),
        ("1-16:5/", "''"),  # a trailing separator leaves an empty entry
    ],
)
def test_bad_tables_name_the_bad_part(table: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make_policy(f"static-table:table={table}", EngineTraits(max_k=5))


@pytest.mark.parametrize("spec", ["static-table", "static-table:table=1-8:4/9-32:2/33-64:1"])
def test_spec_round_trips(spec: str) -> None:
    policy = make_policy(spec, EngineTraits(max_k=5))
    rebuilt = make_policy(policy.spec, EngineTraits(max_k=5))
    assert type(rebuilt) is type(policy) and rebuilt.params == policy.params and rebuilt.spec == policy.spec
    assert policy.spec == spec

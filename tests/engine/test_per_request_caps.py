"""Engine tier: a policy's per-request caps cut each request's drafts before verification, losslessly,
and a user policy module registers itself in the engine process."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def engine(shared_engine):  # its policy modules include capped_policy
    return shared_engine


def test_capped_requests_verify_only_their_prefix_and_the_output_is_unchanged(engine):
    uncapped_before, uncapped, capped = engine.against_fixed_k("test-alternate-cap:k=4,cap=1", max_tokens=40)
    assert uncapped.speculation.num_drafts_capped == uncapped_before.speculation.num_drafts_capped
    assert capped.speculation.num_drafts_capped > uncapped.speculation.num_drafts_capped
    # Half the requests stop at one draft, so deep positions are drafted far less often than position 0.
    drafted = [
        a - b
        for a, b in zip(capped.speculation.num_drafted_per_pos, uncapped.speculation.num_drafted_per_pos, strict=True)
    ]
    base = [
        a - b
        for a, b in zip(
            uncapped.speculation.num_drafted_per_pos, uncapped_before.speculation.num_drafted_per_pos, strict=True
        )
    ]
    assert base[0] > 0 and base[3] >= 0.9 * base[0]
    assert drafted[0] > 0 and drafted[3] <= 0.6 * drafted[0]


def test_an_unknown_policy_module_fails_the_config_with_its_name():
    from specserve.cluster.config import ServeConfig

    with pytest.raises(ValueError, match="no_such_policy_module"):
        ServeConfig(speculation={"policy_modules": ("no_such_policy_module",)})

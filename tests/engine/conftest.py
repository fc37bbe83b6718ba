"""The engine tier's shared engine: starting one costs 20-40 s on a 2-core CPU, so the tests that need nothing of
an engine but the trained pair under specserve's scheduler share one. Each sets its own policy and reads counters
and step-log lines as differences from its own start; a test that needs a fresh engine or other engine arguments
starts its own."""

from __future__ import annotations

import pytest
from engine_helpers import running_engine


@pytest.fixture(scope="session")
def shared_engine(trained_pair, scratch):
    with running_engine(
        trained_pair,
        policy="fixed:k=0",
        policy_modules=("signal_policies", "capped_policy", "broken_policy"),
        step_log=str(scratch / "shared-engine-steps.jsonl"),
    ) as engine:
        yield engine

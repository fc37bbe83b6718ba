"""The engine tier's shared engine: starting one costs 20-40 s on a 2-core CPU, so the tests that need nothing of
an engine but the trained pair under specserve's scheduler share one. Each sets its own policy and reads counters
and step-log lines as differences from its own start; a test that needs a fresh engine or other engine arguments
starts its own."""

from __future__ import annotations

from contextlib import ExitStack

import pytest
from engine_helpers import running_engine

# Held outside pytest's fixture cache so that it stops with the tier's last test rather than the session: its
# EngineCore process would otherwise live on through the later tiers, whose tests count the test process's
# children (the CPU tally, `engine_cpus`).
_stack = ExitStack()


@pytest.fixture(scope="session")
def shared_engine(trained_pair, scratch):
    engine = _stack.enter_context(
        running_engine(
            trained_pair,
            policy="fixed:k=0",
            policy_modules=("signal_policies", "capped_policy", "broken_policy"),
            step_log=str(scratch / "shared-engine-steps.jsonl"),
        )
    )
    yield engine
    _stack.close()


def pytest_runtest_teardown(item, nextitem):
    if nextitem is None or nextitem.path.parent != item.path.parent:
        _stack.close()

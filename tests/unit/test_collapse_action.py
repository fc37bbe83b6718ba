"""Which engines the collapse action may restore the draft on (``replicas/core/collapse_action.restore_refusal``):
the reason it gives where it only turns speculation off and probes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specserve.replicas.core.collapse_action import restore_refusal
from specserve.speculation.methods import method as method_named


def scheduler(method: str = "draft_model", refused: str = "", draft_bytes: int = 1000, skips: bool = True):
    return SimpleNamespace(
        method=method_named(method),
        elastic=SimpleNamespace(refused=refused, draft_bytes=draft_bytes),
        skips_k0_draft_pass=skips,
    )


def test_a_separate_draft_model_on_a_cpu_engine_is_restored():
    assert restore_refusal(scheduler()) == ""


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"method": "ngram"}, "ngram has no weights to restore"),
        ({"method": "eagle3"}, "restoring a eagle3 draft is not supported"),
        ({"method": "mtp"}, "restoring a mtp draft is not supported"),
        ({"refused": "elastic draft memory runs on CPU engines only (this one: cuda)"}, "CPU engines only"),
        ({"draft_bytes": 0}, "no local .safetensors checkpoint"),
        ({"skips": False}, "skip_k0_draft_pass is off"),
    ],
)
def test_where_the_draft_cannot_be_rebuilt_the_reason_says_why(changes, words):
    assert words in restore_refusal(scheduler(**changes))

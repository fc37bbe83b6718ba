"""A plain step builds attention metadata without the groups that hold draft layers only."""

from __future__ import annotations

from types import SimpleNamespace

from specserve.replicas.worker.plain_step import without_draft_only_groups

DRAFT = {"draft_model.layers.0.attn", "draft_model.layers.1.attn"}


def group(*layers: str) -> SimpleNamespace:
    return SimpleNamespace(layer_names=list(layers))


def test_a_group_of_draft_layers_only_is_left_out():
    target, draft = group("model.layers.0.attn", "model.layers.1.attn"), group(*sorted(DRAFT))
    assert without_draft_only_groups([[target, draft]], DRAFT) == [[target]]


def test_a_group_the_draft_shares_with_the_target_stays():
    shared = group("model.layers.0.attn", "draft_model.layers.0.attn")
    assert without_draft_only_groups([[shared], [group("draft_model.layers.1.attn")]], DRAFT) == [[shared], []]

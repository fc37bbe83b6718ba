"""SpecKV's training side (lab/speckv): the trainer, samples files, the synthetic data and the packaged default
weights they make."""

from __future__ import annotations

import json
import math

import pytest

from lab.speckv.samples import parse_sample, record_samples
from lab.speckv.synthetic import synthetic_samples
from lab.speckv.training import mean_squared_error, train_file, train_mlp, train_synthetic
from specserve.speculation import StepRecord
from specserve.speculation.speckv.model import load_weights, weights_from_json, weights_to_json


def test_training_reduces_loss_and_is_deterministic() -> None:
    samples = synthetic_samples(300, seed=3)
    untrained = train_mlp(samples, epochs=1, learning_rate=1e-6, seed=1)
    trained = train_mlp(samples, epochs=15, learning_rate=3e-3, seed=1)
    assert mean_squared_error(trained, samples) < 0.7 * mean_squared_error(untrained, samples)
    assert train_mlp(samples, epochs=2, seed=5) == train_mlp(samples, epochs=2, seed=5)


def test_train_file_trains_on_jsonl_samples(tmp_path) -> None:
    lines = []
    for features, rate in synthetic_samples(60, seed=9):
        entry = dict(
            zip(
                (
                    "mean_draft_entropy",
                    "mean_draft_confidence",
                    "max_draft_entropy",
                    "min_draft_confidence",
                    "compression",
                    "gamma",
                ),
                features,
                strict=True,
            )
        )
        entry["compression"] = ("fp16", "int8", "nf4")[int(features[4])]
        lines.append(json.dumps({**entry, "acceptance_rate": rate}))
    lines.append(json.dumps({**entry, "accepted": True}))  # a flag is a 0/1 target
    source = tmp_path / "samples.jsonl"
    source.write_text("\n".join(lines) + "\n")
    weights, samples = train_file(source, epochs=2)
    assert len(samples) == 61 and samples[-1][1] == 1.0
    assert weights_from_json(weights_to_json(weights)) == weights
    assert weights.provenance.startswith("trained on samples.jsonl (61 samples)")
    source.write_text('{"gamma": 4}\n')
    with pytest.raises(ValueError, match="line 1"):
        train_file(source)
    source.write_text("\n")
    with pytest.raises(ValueError, match="no samples"):
        train_file(source)


def test_synthetic_samples_are_reproducible() -> None:
    assert synthetic_samples(5, seed=1) == synthetic_samples(5, seed=1)


def test_record_samples_round_trip_through_the_jsonl_parser() -> None:
    """One sample per drafting request, gamma its own draft count, features in bits; the parser reads them back."""
    confidences, entropies = (0.9, 0.5), (math.log(2), 2 * math.log(2))
    record = StepRecord(
        now_s=0.0,
        k=2,
        duration_s=0.01,
        num_running=3,
        num_context_tokens=300,
        num_batched_tokens=9,
        num_draft_passes=2,
        num_emitted_tokens=5,
        num_drafted_per_request=(2, 0, 1),
        num_accepted_per_request=(1, 0, 1),
        request_ids=("a", "b", "c"),
        draft_confidence_per_request=(confidences, (), (0.8,)),
        draft_entropy_per_request=(entropies, (), (0.1,)),
    )
    samples = record_samples(record, "int8")
    assert [s["gamma"] for s in samples] == [2, 1] and [s["acceptance_rate"] for s in samples] == [0.5, 1.0]
    assert samples[0]["mean_draft_entropy"] == 1.5 and samples[0]["min_draft_confidence"] == 0.5
    features, target = parse_sample(json.dumps(samples[0]), 1)
    assert features == pytest.approx((1.5, 0.7, 2.0, 0.5, 1.0, 2.0)) and target == 0.5
    assert (
        record_samples(
            StepRecord(
                now_s=0.0,
                k=2,
                duration_s=0.01,
                num_running=1,
                num_context_tokens=1,
                num_batched_tokens=3,
                num_draft_passes=2,
                num_emitted_tokens=1,
                num_drafted_per_request=(2,),
                num_accepted_per_request=(0,),
            )
        )
        == []
    )


def test_the_packaged_default_weights_are_train_synthetic_with_its_defaults() -> None:
    assert train_synthetic() == load_weights()

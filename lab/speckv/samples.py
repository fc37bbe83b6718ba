"""SpecKV's training samples: one JSONL line per request per speculative step, read and written here.

One JSON object per line (the step-record fields of SpecKV's released profiling data, §4.1):

    {"mean_draft_entropy": 1.9, "mean_draft_confidence": 0.71, "max_draft_entropy": 3.2,
     "min_draft_confidence": 0.42, "compression": "fp16", "gamma": 4, "acceptance_rate": 0.75}

Entropies in bits; compression is fp16 / int8 / nf4 or its code 0 / 1 / 2; the target is
``acceptance_rate`` (accepted / gamma, the paper's y) or, failing that, a boolean ``accepted`` taken as 0/1.

``record_samples`` turns a ``StepRecord`` with draft signals into such lines, so the same file comes from the
simulator (``python -m lab mlp-samples``) or from an engine's step log once it records signals. The features
are those of the step's own drafts, as the paper's offline training uses them (§4.2); the policy applies the
predictor to the previous step's (lagged).
"""

from __future__ import annotations

import json
from pathlib import Path

from specserve.speculation.speckv.model import COMPRESSION_CODES, FEATURE_NAMES, Sample, step_features
from specserve.speculation.types import StepRecord


def record_samples(record: StepRecord, compression: str = "fp16") -> list[dict[str, float | int | str]]:
    """One sample per request that drafted with signals this step; none from a record without signals.

    gamma is the request's own draft count (a per-request cap or an early stop can make it less than k),
    so acceptance_rate = accepted / gamma stays in [0, 1].
    """
    if compression not in COMPRESSION_CODES:
        raise ValueError(f"compression={compression!r} must be one of {', '.join(COMPRESSION_CODES)}")
    samples: list[dict[str, float | int | str]] = []
    # strict=False: a record without signals (the vLLM engine's so far) has empty signal tuples, and the
    # truncation to none is what yields no samples from it.
    for num_drafted, num_accepted, confidences, entropies in zip(
        record.num_drafted_per_request,
        record.num_accepted_per_request,
        record.draft_confidence_per_request,
        record.draft_entropy_per_request,
        strict=False,
    ):
        if num_drafted == 0 or len(confidences) != num_drafted or len(entropies) != num_drafted:
            continue
        mean_h, mean_c, max_h, min_c = step_features(confidences, entropies)
        samples.append(
            {
                "mean_draft_entropy": round(mean_h, 4),
                "mean_draft_confidence": round(mean_c, 4),
                "max_draft_entropy": round(max_h, 4),
                "min_draft_confidence": round(min_c, 4),
                "compression": compression,
                "gamma": num_drafted,
                "acceptance_rate": num_accepted / num_drafted,
            }
        )
    return samples


def parse_sample(line: str, line_number: int) -> Sample:
    """One JSONL line as (features, target); errors name the line and the field."""
    try:
        record = json.loads(line)
        compression = record["compression"]
        if isinstance(compression, str):
            compression = COMPRESSION_CODES[compression.lower()]
        values = [float(record[name]) for name in FEATURE_NAMES if name != "compression"]
        values.insert(FEATURE_NAMES.index("compression"), float(compression))
        target = float(record["acceptance_rate"]) if "acceptance_rate" in record else float(bool(record["accepted"]))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"line {line_number}: not a sample ({type(exc).__name__}: {exc})") from None
    if not 0.0 <= target <= 1.0:
        raise ValueError(f"line {line_number}: acceptance_rate={target} must lie in [0, 1]")
    return tuple(values), target


def read_samples(path: Path) -> list[Sample]:
    with path.open() as lines:
        return [parse_sample(line, n) for n, line in enumerate(lines, 1) if line.strip()]

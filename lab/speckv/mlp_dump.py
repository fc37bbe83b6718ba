"""SpecKV training samples from a simulator run: ``python -m lab mlp-samples``.

Every speculative step of the run yields one sample per drafting request (speculation.speckv.samples); a
seeded reservoir keeps at most ``max_samples`` of them, spread over the whole run rather than its start,
because training is pure Python (10k samples x 100 epochs take about 15 s on one core).

The default policy cycles k over the paper's candidate gammas {2, 4, 6, 8} (SpecKV §4.1: its
profiling grid runs every gamma), capped at the scenario's max_k, so the predictor sees each gamma it will score.
The signals are the simulator's (sim.signals): a predictor trained on them learns the simulator's
confidence-acceptance link, not a real draft's.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from lab.speckv.samples import record_samples
from specserve.sim.config import Scenario
from specserve.sim.runner import simulate
from specserve.sim.steps import StepStats
from specserve.speculation.types import StepRecord

PAPER_GAMMAS = (2, 4, 6, 8)
DEFAULT_MAX_SAMPLES = 10_000


def default_policy(max_k: int) -> str:
    """``cycle`` over the paper's gammas at most ``max_k`` (max_k itself if none is)."""
    gammas = [g for g in PAPER_GAMMAS if g <= max_k] or [max_k]
    return "cycle:ks=" + "-".join(map(str, gammas))


def collect_samples(
    scenario: Scenario,
    policy_spec: str,
    seed: int = 0,
    compression: str = "fp16",
    max_samples: int = DEFAULT_MAX_SAMPLES,
) -> tuple[list[dict], int]:
    """(kept samples in step order, samples the run produced). Reservoir sampling (Algorithm R), seeded."""
    if max_samples < 1:
        raise ValueError(f"max_samples={max_samples} must be at least 1")
    rng = random.Random(seed)
    kept: list[tuple[int, dict]] = []  # (index in the run, sample): sorted back into step order at the end
    seen = 0

    def on_step(record: StepRecord, stats: StepStats) -> None:
        nonlocal seen
        for sample in record_samples(record, compression):
            if len(kept) < max_samples:
                kept.append((seen, sample))
            else:
                slot = rng.randrange(seen + 1)
                if slot < max_samples:
                    kept[slot] = (seen, sample)
            seen += 1

    simulate(scenario, policy_spec, seed, on_step=on_step)
    return [sample for _, sample in sorted(kept, key=lambda pair: pair[0])], seen


def write_samples(path: Path, samples: list[dict]) -> None:
    path.write_text("".join(json.dumps(sample) + "\n" for sample in samples))

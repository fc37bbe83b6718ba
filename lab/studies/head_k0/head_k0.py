"""What an EAGLE-3 head's k = 0 costs, and what skipping it would keep: the numbers behind ``Method.k0`` for heads.

    PYTHONPATH=$PWD .venv/bin/python lab/studies/head_k0/head_k0.py [--rounds 3] [--out FILE]

One engine: the bundled tiny target with its bundled EAGLE-3 head (``specserve models make --kind eagle3``),
specserve's scheduler and worker, a step log. Per round, at batch 1, 4 and 8, it decodes under ``fixed:k=0`` (the
head's one sync pass runs on every step, as vLLM does) and reads, from the step log, each decode-only step's wall
time and the seconds the worker spent in the head's propose (``StepRecord.draft_s``): their ratio is what a skip
would save. Then it decodes under ``fixed:k=3`` and under a cycle with k = 0 stretches, and compares acceptance per
position: running the head at k = 0 keeps its KV whole, so resumption should accept as steady speculation does.

The third option, keeping the target's hidden states of skipped steps for a catch-up, is priced from the head's
config: EAGLE-3 reads three aux layers, so 3 x hidden_size values per token per request (bytes at the engine's
dtype), against the head pass it would save.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from lab.experiments.report_io import emit_report
from specserve.models.prompts import OPENINGS

BATCHES = (1, 4, 8)
CYCLE = "cycle:ks=3-3-0-0-0-0-0-0-3-3-3-3"
TOKENS = 64


def generate(llm: Any, batch: int, tokens: int = TOKENS) -> None:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    llm.generate([OPENINGS[i % len(OPENINGS)] for i in range(batch)], params, use_tqdm=False)


def k0_shares(log: Path, start: int, batch: int) -> tuple[list[float], list[float], int]:
    """Decode-only k = 0 steps at the full batch logged after line ``start``: head seconds over step seconds, the
    step seconds, and the log's length."""
    from specserve.speculation import step_log

    with log.open() as f:
        steps = list(step_log.read(f))
    shares, durations = [], []
    for s in steps[start:]:
        r = s.record
        if r.k == 0 and r.num_running == batch and s.ctx.num_prefill_tokens == 0 and r.duration_s > 0:
            shares.append(r.draft_s / r.duration_s)
            durations.append(r.duration_s)
    return shares, durations, len(steps)


def acceptance(llm: Any, policy: str, batch: int) -> list[float]:
    from specserve.replicas.tools import offline

    offline.set_policy(llm, policy)
    before = offline.read_telemetry(llm).speculation
    generate(llm, batch, 96)
    after = offline.read_telemetry(llm).speculation
    reached = [a - b for a, b in zip(after.num_reached_per_pos, before.num_reached_per_pos, strict=True)]
    accepted = [a - b for a, b in zip(after.num_accepted_per_pos, before.num_accepted_per_pos, strict=True)]
    return [round(a / r, 3) if r else 0.0 for a, r in zip(accepted, reached, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from specserve.models import cached_pair
    from specserve.models.cache import cached_head
    from specserve.replicas.config.engine_args import EngineSpec, speculative_engine_kwargs
    from specserve.replicas.tools import offline

    pair, head = cached_pair("trained"), cached_head("eagle3")
    config = json.loads((head / "config.json").read_text())
    log = Path(tempfile.mkdtemp()) / "steps.jsonl"
    spec = EngineSpec(
        str(pair.target),
        str(head),
        "fixed:k=0",
        max_k=3,
        method="eagle3",
        dtype="float32",
        step_log=str(log),
        # vLLM's CPU backend reserves this share of the machine's memory; 64 blocks hold batch 8 at 512 tokens.
        extra=(("gpu_memory_utilization", 0.3), ("num_gpu_blocks_override", 64)),
    )
    per_batch: dict[int, list[float]] = {b: [] for b in BATCHES}
    step_ms: dict[int, list[float]] = {b: [] for b in BATCHES}
    with offline.offline_llm(**speculative_engine_kwargs(spec)) as llm:
        generate(llm, 8, 16)  # warm-up
        start = 0
        for r in range(args.rounds):
            offline.set_policy(llm, "fixed:k=0")
            for batch in BATCHES[r % 3 :] + BATCHES[: r % 3]:
                _, _, start = k0_shares(log, 0, batch)
                generate(llm, batch)
                shares, durations, start = k0_shares(log, start, batch)
                per_batch[batch].append(statistics.median(shares))
                step_ms[batch].append(statistics.median(durations) * 1000)
        steady = acceptance(llm, "fixed:k=3", 4)
        cycled = acceptance(llm, CYCLE, 4)
    hidden = int(config["hidden_size"])
    report = {
        "command": "PYTHONPATH=$PWD .venv/bin/python lab/studies/head_k0/head_k0.py " + f"--rounds {args.rounds}",
        "head": str(head),
        "k0_head_share_of_step": {b: round(statistics.median(v), 4) for b, v in per_batch.items()},
        "k0_head_share_per_round": per_batch,
        "k0_step_ms": {b: round(statistics.median(v), 3) for b, v in step_ms.items()},
        "acceptance_per_pos_fixed_k3": steady,
        "acceptance_per_pos_cycle_with_k0_stretches": cycled,
        "kept_hidden_bytes_per_token_per_request_fp32": 3 * hidden * 4,
        "kept_hidden_bytes_per_token_per_request_bf16": 3 * hidden * 2,
    }
    emit_report(report, args.out)


if __name__ == "__main__":
    main()

"""Measure a pair's greedy acceptance rates on vLLM (`specserve models measure`).

Acceptance at draft position j is ``accepted_per_pos[j] / num_drafts``, from vLLM's own counters
(``vllm:spec_decode_num_drafts``, ``vllm:spec_decode_num_accepted_tokens_per_pos``). With a fixed k,
every draft has k positions, so this is the probability that the first j+1 draft tokens are all
accepted. Mean acceptance length is ``1 + accepted / drafts``: tokens emitted per target step.

The engine itself runs in ``specserve.replicas.tools.offline``, where every use of vLLM lives. A script
calling this needs an ``if __name__ == "__main__":`` guard (vLLM spawns its EngineCore), and one
measurement costs an engine start (about 15 s on a 2-core CPU).
"""

from __future__ import annotations

from specserve.models.build import PairPaths

# Python-flavoured openings, like the stdlib text the trained pair learned from.
PROMPTS = (
    "import os\nimport sys\n\n",
    "def main(argv=None):\n    ",
    "class Config:\n    def __init__(self, ",
    "    for name, value in ",
    "# Copyright (c) Python Software Foundation.\n",
    'if __name__ == "__main__":\n    ',
    "        return self.",
    "from collections import ",
    "    try:\n        ",
    'def _check(value):\n    """Return ',
    "        if not isinstance(",
    "    @property\n    def ",
)


def measure_acceptance(pair: PairPaths, *, k: int = 4, num_prompts: int = 8, max_tokens: int = 64) -> dict[str, object]:
    """Greedy-decode ``num_prompts`` prompts with draft-model speculation and return acceptance stats."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be at least 1, got {num_prompts}")
    from specserve.replicas.tools.offline import measure_speculation

    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(num_prompts)]
    run = measure_speculation(str(pair.target), str(pair.draft), prompts, k=k, max_tokens=max_tokens)
    num_drafts, accepted_per_pos = run["num_drafts"], run["num_accepted_per_pos"]
    return {
        "target": str(pair.target),
        "draft": str(pair.draft),
        "k": k,
        "num_prompts": num_prompts,
        "max_tokens": max_tokens,
        **run,
        "acceptance_per_pos": [round(a / num_drafts, 4) if num_drafts else 0.0 for a in accepted_per_pos],
        "mean_acceptance_length": (round(1.0 + run["num_accepted_tokens"] / num_drafts, 4) if num_drafts else 1.0),
    }

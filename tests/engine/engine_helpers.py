"""A real vLLM engine (CPU) under specserve's scheduler, driven synchronously from a test."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from specserve.messages import EngineTelemetry
from specserve.replicas import offline
from specserve.replicas.engine_args import EngineSpec, speculative_engine_kwargs

PROMPTS = [
    "def fibonacci(n):\n    ",
    "import os\nimport sys\n\n",
    "class Parser:\n    def __init__(self",
    "for line in open(path):\n",
]


class Engine:
    def __init__(self, llm) -> None:
        self.llm = llm

    def set_policy(self, spec: str) -> str:
        return offline.set_policy(self.llm, spec)

    def telemetry(self, since_step: int = 0) -> EngineTelemetry:
        return offline.read_telemetry(self.llm, since_step)

    def generate(self, prompts: list[str] = PROMPTS, max_tokens: int = 48) -> list[list[int]]:
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [list(output.outputs[0].token_ids) for output in outputs]

    def vllm_counters(self) -> dict[str, object]:
        return {metric.name: metric for metric in self.llm.get_metrics()}


@contextmanager
def running_engine(pair, policy: str, max_k: int = 4, max_num_seqs: int = 8) -> Iterator[Engine]:
    kwargs = speculative_engine_kwargs(
        EngineSpec(
            target=str(pair.target), draft=str(pair.draft), policy=policy, max_k=max_k, max_num_seqs=max_num_seqs
        )
    )
    with offline.offline_llm(**kwargs) as llm:
        yield Engine(llm)

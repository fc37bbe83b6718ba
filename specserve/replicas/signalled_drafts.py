"""The draft token ids a worker hands the scheduler, with the draft's signals per token (see ``draft_signals``).

Its own module, light to import: the EngineCore process unpickles it under the multiprocess executor without
loading the worker's model runner."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.v1.outputs import DraftTokenIds


@dataclass
class SignalledDraftTokenIds(DraftTokenIds):
    """vLLM's draft token ids with, aligned to them, the draft's confidence (its probability of the token it
    drafted) and the entropy of its distribution in nats, per drafted token."""

    confidences: list[list[float]] = field(default_factory=list)
    entropies: list[list[float]] = field(default_factory=list)

"""What each request asks: the default random-word prompts, or the mixed workload (``--workload mixed``).

The mixed workload sends two classes of request, tagged so the report gives numbers per class:

- ``copy``: an instruction to repeat a function under a new name, the function, and its renamed opening. The
  answer re-states a span of the prompt, as in code edits, quoting a retrieved passage, or an agent re-stating
  its plan: the case where prompt-lookup (n-gram) speculation (Saxena 2023, "Prompt Lookup Decoding"; vLLM's
  ``ngram`` method) finds its drafts in the prompt.
- ``free``: a bare function opening; nothing in the prompt says what comes next.

Both come from ``mixed_bank.json``, which ``bench/mixed_bank.py`` builds (its docstring says why the copy blocks
are the bundled tiny target's own text).
Which class request ``i`` is, and which bank entry it takes, depend only on the seed and ``i``: the same command
sends the same requests in the same order, whatever the load shape and however many requests it sends. The
share of copy requests among the first ``m`` is ``round(m * share)`` at every multiple of ``MIX_BLOCK``, their
places within each block of ``MIX_BLOCK`` shuffled, so a short run has the mix asked for and no fixed pattern.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from specserve.bench.load import BenchError

# Built by bench/mixed_bank.py from the bundled tiny target (its docstring says how and why).
BANK_PATH = Path(__file__).with_name("mixed_bank.json")

COPY, FREE = "copy", "free"
CLASSES = (COPY, FREE)
WORKLOADS = ("random", "mixed")
MIX_BLOCK = 20


@dataclass(frozen=True, slots=True)
class PromptRequest:
    """One request's prompt, its class (None outside the mixed workload) and its length as planned: the report
    counts the server's ``usage.prompt_tokens`` where the server sends it."""

    text: str
    request_class: str | None
    prompt_tokens: int


class Workload(Protocol):
    def request(self, index: int, prompt_tokens: int) -> PromptRequest: ...


def opening(name: str, args: str, first: str) -> str:
    """A function's opening: its header, and the first line of its body where the bank gives one."""
    return f"def {name}({args}):\n{first}"


def copy_prompt(name: str, args: str, first: str, block: str) -> str:
    """The copy request: an instruction, the function, and its renamed opening, which the answer continues."""
    renamed = opening(f"{name}_copy", args, first)
    return f"# Repeat {name} as {name}_copy:\n{opening(name, args, first)}{block}\n\n{renamed}"


@cache
def bank() -> dict[str, Any]:
    return json.loads(BANK_PATH.read_text(encoding="utf-8"))


def copies_before(m: int, share: float) -> int:
    """Copy requests among the first ``m`` at the block boundaries: the share, rounded half up."""
    return math.floor(m * share + 0.5)


class MixedWorkload:
    """Request ``index``'s class and prompt, from the seed alone (module docstring)."""

    def __init__(self, seed: int = 0, copy_share: float = 0.5, entries: dict[str, Any] | None = None) -> None:
        if not 0.0 <= copy_share <= 1.0:
            raise BenchError(f"--copy-share {copy_share:g}: must be between 0 and 1")
        self.seed = seed
        self.copy_share = copy_share
        self.entries = entries if entries is not None else bank()
        self._blocks: dict[int, np.ndarray] = {}

    def request_class(self, index: int) -> str:
        block, place = divmod(index, MIX_BLOCK)
        if block not in self._blocks:
            start = block * MIX_BLOCK
            count = copies_before(start + MIX_BLOCK, self.copy_share) - copies_before(start, self.copy_share)
            order = np.random.default_rng([self.seed, 3, block]).permutation(MIX_BLOCK)
            self._blocks[block] = order[:count]
        return COPY if place in self._blocks[block] else FREE

    def prompt(self, index: int, request_class: str) -> str:
        entries = self.entries[request_class]
        pick = entries[int(np.random.default_rng([self.seed, 4, index]).integers(len(entries)))]
        if request_class == COPY:
            return copy_prompt(pick["name"], pick["args"], pick["first"], pick["block"])
        return opening(pick["name"], pick["args"], pick["first"])

    def request(self, index: int, prompt_tokens: int = 0) -> PromptRequest:
        """``prompt_tokens`` (the load's --input-len) is ignored: the bank's prompts bring their own lengths."""
        kind = self.request_class(index)
        text = self.prompt(index, kind)
        return PromptRequest(text, kind, len(text.split()))

    def requests(self, count: int) -> list[PromptRequest]:
        return [self.request(i) for i in range(count)]


def make_workload(name: str, seed: int, copy_share: float | None, tokenizer_dir: str | None) -> Workload:
    """The ``--workload`` of a run; flags that mean nothing to it are errors, not ignored."""
    from specserve.bench.prompts import Prompter

    if name == "random":
        if copy_share is not None:
            raise BenchError(f"--copy-share {copy_share:g}: only the mixed workload has classes (--workload mixed)")
        return Prompter(seed, tokenizer_dir)
    if name != "mixed":
        raise BenchError(f"--workload {name!r}: one of {', '.join(WORKLOADS)}")
    if tokenizer_dir is not None:
        raise BenchError("--tokenizer: the mixed workload's prompts are fixed text; it sets no prompt length")
    return MixedWorkload(seed, 0.5 if copy_share is None else copy_share)

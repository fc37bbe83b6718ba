"""Prompts of a requested token length, for any model.

Without a tokenizer a prompt is that many common English words: most BPE vocabularies hold each as one
token after a space, so the length is close, not exact (the server's ``usage.prompt_tokens`` is what the
report counts). With ``--tokenizer DIR`` the length is exact for that tokenizer. Every prompt starts
differently, so a server's prefix cache cannot turn the benchmark into a cache benchmark.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specserve.bench.workload import PromptRequest

WORDS = (
    "the of and to in is that it was for on are as with his they at be this from have or by one had not but "
    "what all were when we there can an your which their said if do will each about how up out them then she "
    "many some so these would other into has more her two like him see time could no make than first been its "
    "who now people my made over did down only way find use may water long little very after words called just "
    "where most know get through back much go good new write our me man too any day same right look think also"
).split()


class Prompter:
    """Makes prompt ``i`` of ``n`` tokens; the same seed gives the same prompts."""

    def __init__(self, seed: int = 0, tokenizer_dir: str | None = None) -> None:
        self.rng = np.random.default_rng(seed)
        self.tokenizer: Any = None
        if tokenizer_dir is not None:
            from transformers import AutoTokenizer  # only with --tokenizer: it is slow to import

            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)

    def words(self, n: int) -> str:
        return " ".join(WORDS[i] for i in self.rng.integers(0, len(WORDS), n))

    def prompt(self, n: int) -> str:
        if self.tokenizer is None:
            return self.words(n)
        return self._exact(n)

    def request(self, index: int, n: int) -> PromptRequest:
        """The next prompt, as the load generator asks for one (``workload.Workload``); the words carry no class."""
        return PromptRequest(self.prompt(n), None, n)

    def prompts(self, count: int, n: int) -> list[str]:
        """The next ``count`` prompts of ``n`` tokens: what a closed loop of ``count`` requests sends, in order."""
        return [self.prompt(n) for _ in range(count)]

    def _exact(self, n: int) -> str:
        # Decoding n ids and encoding again can merge or split tokens at the seams, so trim or pad with
        # words until the encoded length is n (a few rounds at most).
        ids = self._encode(self.words(n + 8))[:n]
        text = self.tokenizer.decode(ids)
        for _ in range(8):
            count = len(self._encode(text))
            if count == n:
                break
            if count > n:
                text = self.tokenizer.decode(self._encode(text)[: n - (count - n)])
            else:
                text += " " + self.words(n - count)
        return text

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

"""Loggers for specserve code that runs inside vLLM's engine process.

vLLM's logging config (``vllm/logger.py``, vLLM 0.32.0) gives a handler to its ``vllm`` logger alone and turns
its propagation off, so a logger named after a specserve module printed nothing there: the scheduler's policy
lines, the draft's offload and reload decisions and the start-up warm-up were silent, served or offline. A child
of ``vllm`` prints with vLLM's own format and level (``VLLM_LOGGING_LEVEL``), beside the engine's lines.
"""

from __future__ import annotations

import logging


def engine_logger(module: str) -> logging.Logger:
    """The logger for ``module`` (its ``__name__``), under vLLM's configured ``vllm`` logger."""
    return logging.getLogger(f"vllm.{module}")

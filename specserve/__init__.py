"""specserve: Ray Serve LLM + vLLM serving whose speculative decoding adapts while it serves.

The public Python API is for people who already run Ray Serve LLM (``specserve.llm``)::

    from specserve import speculative_llm_config
    llm_config = speculative_llm_config(llm_config, draft="meta-llama/Llama-3.2-1B-Instruct")

Its names load on first use: every ``specserve.*`` module, the CLI and the pure simulator included, imports this
package first, and most of them need none of what the API imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specserve.cluster.app import build_openai_app
    from specserve.llm import ConfigNote, CpuEngine, Speculation, speculative_llm_config, speculative_llm_config_kwargs

# Public name -> the module that defines it.
_PUBLIC = {
    "speculative_llm_config": "specserve.llm",
    "speculative_llm_config_kwargs": "specserve.llm",
    "Speculation": "specserve.llm",
    "CpuEngine": "specserve.llm",
    "ConfigNote": "specserve.llm",
    "build_openai_app": "specserve.cluster.app",
}
__all__ = [
    "ConfigNote",
    "CpuEngine",
    "Speculation",
    "build_openai_app",
    "speculative_llm_config",
    "speculative_llm_config_kwargs",
]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'specserve' has no attribute {name!r}")

"""Keep a request's top_k from killing the engine (vLLM 0.32.0).

With a speculative config vLLM's runner always samples through the rejection sampler, also on steps where no
request has draft tokens (prefills; every k = 0 step of an adaptive policy). The sampler then applies top-k to
the target logits of the draft positions, of which there are none, and ``apply_top_k_only`` calls ``k.max()``
on an empty tensor: a RuntimeError in the EngineCore, which dies and takes every request with it. One request
with ``top_k`` set (``"top_k": 1`` or ``true``) was enough. With no rows there is nothing to constrain, so the
wrapper returns the empty logits unchanged; every other call goes to vLLM's function.

Installed in the worker process by the worker extension (``extension.install``).

Private vLLM interfaces touched (paths under ``vllm/``, vLLM 0.32.0):

- ``v1/sample/rejection_sampler.py:578``: ``apply_sampling_constraints`` calls the module-level name
  ``apply_top_k_top_p(logits, top_k, top_p)``, which is replaced.
- ``v1/sample/ops/topk_topp_sampler.py:529``: ``apply_top_k_only``'s ``k.max()``, the call that fails.
- ``v1/sample/rejection_sampler.py:581`` ``expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from,
  replace_to)``: replaced on CPU (used for temperature, top_k and top_p per draft position).
- ``utils/cpu_triton_utils.py:390`` ``_expand_kernel_impl``: ``_ensure_int64(output)`` writes into a copy.
"""

from __future__ import annotations

from typing import Any

import torch

from specserve.replicas import vllm_hooks

# vLLM's symbols this module replaces (``install``), checked against the pinned vLLM by tests/unit/test_vllm_surface.py.
TARGETS = (
    "vllm.v1.sample.rejection_sampler:apply_top_k_top_p",
    "vllm.v1.sample.rejection_sampler:expand_batch_to_tokens",
)
# vLLM's functions, kept by ``install``.
_vllm_apply_top_k_top_p: Any = None
_vllm_expand_batch_to_tokens: Any = None


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> Any:
    if logits.shape[0] == 0:
        return logits
    return _vllm_apply_top_k_top_p(logits, k, p)


def expand_batch_to_tokens(
    x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0, replace_to: int = 0
) -> torch.Tensor:
    """vLLM's function in plain torch on CPU. There vLLM runs its Triton kernel as ``cpu_tl._expand_kernel_impl``,
    which converts the output tensor to int64 before the C++ kernel fills it: for an int32 (top_k) or float32
    (temperature, top_p) output that is a copy, and the tensor vLLM reads stays uninitialised. A request's top_k
    then read as garbage and ``topk`` failed with "selected index k out of range", killing the engine (a live
    run, top_k = 1); temperatures and top_p per draft position were garbage too. On other devices: vLLM's."""
    if x.device.type != "cpu":
        return _vllm_expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from, replace_to)
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    out = torch.repeat_interleave(x, counts, output_size=num_tokens)
    if replace_from != replace_to:
        out = torch.where(out == replace_from, torch.full_like(out, replace_to), out)
    return out


def install() -> None:
    """Replace both functions in the rejection sampler's module namespace (where ``apply_sampling_constraints`` looks
    them up); once per process."""
    global _vllm_apply_top_k_top_p, _vllm_expand_batch_to_tokens
    _vllm_apply_top_k_top_p = vllm_hooks.replace(TARGETS[0], apply_top_k_top_p)
    _vllm_expand_batch_to_tokens = vllm_hooks.replace(TARGETS[1], expand_batch_to_tokens)

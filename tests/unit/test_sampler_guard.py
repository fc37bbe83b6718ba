"""A request's top_k on a step without draft tokens: vLLM's rejection sampler gets no rows and, unguarded,
raises in the EngineCore (which then dies). The guard that the worker installs returns the empty logits."""

from __future__ import annotations

import pytest
import torch
from vllm.v1.sample import rejection_sampler
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p as vllm_apply_top_k_top_p

from specserve.replicas.worker import sampler_guard

VOCAB = 32


@pytest.fixture(autouse=True, scope="module")
def _installed() -> None:
    sampler_guard.install()  # as the worker extension does; once per process


def test_vllms_own_function_fails_on_a_step_without_draft_tokens() -> None:
    """What the guard is for; when a vLLM upgrade fixes it, this test says the guard can go."""
    with pytest.raises(RuntimeError, match="numel"):
        vllm_apply_top_k_top_p(torch.empty(0, VOCAB), torch.empty(0, dtype=torch.int32), None)


def test_the_rejection_sampler_uses_the_guard_and_keeps_the_empty_step() -> None:
    assert rejection_sampler.apply_top_k_top_p is sampler_guard.apply_top_k_top_p
    out = rejection_sampler.apply_top_k_top_p(torch.empty(0, VOCAB), torch.empty(0, dtype=torch.int32), None)
    assert out.shape == (0, VOCAB)


def test_steps_with_rows_are_vllms() -> None:
    logits = torch.arange(2 * VOCAB, dtype=torch.float32).reshape(2, VOCAB)
    k = torch.tensor([1, 3], dtype=torch.int32)
    kept = sampler_guard.apply_top_k_top_p(logits.clone(), k, None).isfinite().sum(dim=1)
    assert kept.tolist() == [1, 3]


def test_the_per_token_expansion_repeats_each_requests_value_over_its_draft_positions() -> None:
    x = torch.tensor([7, 9, 4], dtype=torch.int32)
    cu = torch.tensor([2, 2, 5], dtype=torch.int32)  # the second request has no draft tokens this step
    assert rejection_sampler.expand_batch_to_tokens is sampler_guard.expand_batch_to_tokens
    assert rejection_sampler.expand_batch_to_tokens(x, cu, 5).tolist() == [7, 7, 4, 4, 4]
    replaced = rejection_sampler.expand_batch_to_tokens(x, cu, 5, replace_from=4, replace_to=1)
    assert replaced.tolist() == [7, 7, 1, 1, 1]
    assert rejection_sampler.expand_batch_to_tokens(x, torch.zeros(3, dtype=torch.int32), 0).shape == (0,)


def test_vllms_cpu_expansion_leaves_a_float_output_unwritten() -> None:
    """The bug the CPU expansion replaces: vLLM's CPU kernel fills an int64 copy of a float32 output."""
    from vllm.utils import cpu_triton_utils

    output = torch.full((3,), -7.0)
    cpu_triton_utils._expand_kernel_impl(output, torch.tensor([0.5, 2.0]), torch.tensor([1, 3]), 0, 0)
    assert output.tolist() == [-7.0, -7.0, -7.0]
    assert sampler_guard.expand_batch_to_tokens(torch.tensor([0.5, 2.0]), torch.tensor([1, 3]), 3).tolist() == [
        0.5,
        2.0,
        2.0,
    ]

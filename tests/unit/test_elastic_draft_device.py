"""Elastic draft memory refuses engines it was not built for (a GPU), and says why; serving is untouched."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specserve.memory import ResidencyParams
from specserve.messages import DraftState
from specserve.replicas.draft_memory.elastic_draft import ElasticDraft


def scheduler_on(device: str, tmp_path) -> SimpleNamespace:
    """What ElasticDraft reads of vLLM's scheduler: its device, the draft's checkpoint and the block pool."""
    draft = SimpleNamespace(model=str(tmp_path / "no-checkpoint"), dtype="bfloat16")
    return SimpleNamespace(
        vllm_config=SimpleNamespace(
            device_config=SimpleNamespace(device_type=device),
            speculative_config=SimpleNamespace(method="draft_model", draft_model_config=draft),
        ),
        kv_cache_manager=SimpleNamespace(block_pool=SimpleNamespace(num_gpu_blocks=8)),
        skips_k0_draft_pass=True,
    )


def test_a_gpu_engine_refuses_offload_and_drops_the_triggers(tmp_path) -> None:
    elastic = ElasticDraft(scheduler_on("cuda", tmp_path), auto=ResidencyParams())
    assert elastic.auto is None  # the triggers would only fail, step after step
    with pytest.raises(RuntimeError, match=r"runs on CPU engines only \(this one: cuda\)"):
        elastic.offload(core=None)
    assert elastic.state is DraftState.RESIDENT


def test_a_cpu_engine_keeps_its_triggers_and_goes_on_to_its_own_checks(tmp_path) -> None:
    elastic = ElasticDraft(scheduler_on("cpu", tmp_path), auto=ResidencyParams())
    assert elastic.auto == ResidencyParams() and not elastic.refused
    with pytest.raises(RuntimeError, match="its size is unknown"):  # this fake draft has no checkpoint
        elastic.offload(core=None)


def test_parking_a_draft_that_is_not_on_a_gpu_is_refused_naming_its_device():
    from specserve.replicas.draft_memory.draft_vmm import ParkedWeights

    with pytest.raises(ValueError, match=r"one CUDA device \(found \['cpu'\]\)"):
        ParkedWeights(torch.nn.Linear(4, 4))


@pytest.mark.parametrize("num_bytes", [1, 3 << 20, 640_000_000, 7 << 30])
def test_a_parked_draft_maps_in_few_chunks_of_the_drivers_granularity_wasting_at_most_one(num_bytes):
    from specserve.replicas.draft_memory.draft_vmm import weights_chunk

    granule, most = 2 << 20, 32
    chunk = weights_chunk(num_bytes, granule, most)
    chunks = -(-num_bytes // chunk)
    assert chunk % granule == 0 and 1 <= chunks <= most
    assert chunks * chunk - num_bytes < chunk, "a whole chunk mapped for nothing"
    assert chunk - granule < -(-num_bytes // most), "chunks bigger than the even split needs"


def test_a_parked_drafts_chunk_refuses_sizes_that_are_not_positive():
    from specserve.replicas.draft_memory.draft_vmm import weights_chunk

    with pytest.raises(ValueError, match="num_bytes=0"):
        weights_chunk(0, 2 << 20)

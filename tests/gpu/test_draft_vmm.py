"""A draft's weights leave the GPU and come back at the same addresses, so graphs captured before still run.

Torch and the CUDA driver only, no vLLM: a small bf16 network stands in for the draft. Skipped without a CUDA
device; run on one with ``python3 -m pytest --noconftest -p no:cacheprovider tests/gpu``.
"""

from __future__ import annotations

import pytest
import torch

from specserve.replicas.draft_memory.draft_vmm import ParkedWeights

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def draft() -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024), torch.nn.LayerNorm(1024)]
    return torch.nn.Sequential(*layers).to("cuda", torch.bfloat16).eval()


def free_bytes() -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


@torch.no_grad()
def test_a_graph_captured_before_the_offload_computes_the_same_after_the_reload():
    model, x = draft(), torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)
    eager = model(x).clone()
    parked = ParkedWeights(model)
    addresses = [t.data_ptr() for t in model.parameters()]
    assert torch.equal(model(x), eager), "moving the weights into the buffer changed them"

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        model(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(x)
    graph.replay()
    before = out.clone()

    free = free_bytes()
    given = parked.offload()
    assert given >= parked.num_bytes and free_bytes() - free == given, "the weights' bytes did not reach the driver"
    taken = torch.full((given,), 7, dtype=torch.uint8, device="cuda")  # what the KV reserve would map meanwhile
    del taken
    torch.cuda.empty_cache()

    done = parked.reload(torch.cuda.Stream())
    torch.cuda.current_stream().wait_event(done)
    assert [t.data_ptr() for t in model.parameters()] == addresses
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, before)
    assert torch.equal(model(x), eager)


def test_offloading_twice_or_reloading_a_resident_draft_is_refused():
    parked = ParkedWeights(draft())
    with pytest.raises(RuntimeError, match="resident"):
        parked.reload(torch.cuda.Stream())
    parked.offload()
    with pytest.raises(RuntimeError, match="already offloaded"):
        parked.offload()

"""A draft model's weights on a GPU that can leave and come back at the same addresses (CUDA virtual memory).

``ParkedWeights`` moves every parameter and buffer of a module into one ``cuda_vmm.VmmBuffer`` (each tensor a
view at a fixed offset) and copies the whole buffer once into pinned host memory; weights never change while
serving, so that copy stays valid. Then:

- **offload** unmaps the buffer's chunks: their bytes go back to the driver at once (for the KV reserve to map),
  with nothing copied, since the host copy already holds them;
- **reload** maps the chunks again at the same virtual addresses and copies the host bytes in on a stream of the
  caller's choosing, without blocking the host; it returns an event that the first draft step must wait on.

Because the addresses never change, CUDA graphs captured over the draft before an offload stay valid after the
reload: nothing is recaptured. While offloaded the draft must not run (the scheduler keeps k = 0): its tensors
point at unmapped memory, and touching them is an illegal-address fault.

Checked on a GPU with torch alone (``tests/gpu/test_draft_vmm.py``); no vLLM engine on a GPU uses it yet.
"""

from __future__ import annotations

import torch

from specserve.replicas.draft_memory.cuda_vmm import Driver, VmmBuffer

# Offsets of tensors inside the buffer: what cuBLAS and vectorised kernels expect of a tensor's start.
_ALIGN = 256
# The weights leave and come back whole, so their chunks need not be fine: mapping costs about 40 us a chunk (2 MiB
# chunks made a 610 MiB draft's reload map for 24 ms on an H200, as long as its copy), so a few dozen suffice.
_MAX_CHUNKS = 32


def weights_chunk(num_bytes: int, granularity: int, max_chunks: int = _MAX_CHUNKS) -> int:
    """The chunk a buffer of ``num_bytes`` is mapped in: a multiple of the driver's ``granularity``, at most
    ``max_chunks`` of them, and never more than one granule bigger than the even split (the last chunk's unused
    tail is at most a chunk)."""
    if num_bytes <= 0 or granularity <= 0 or max_chunks <= 0:
        raise ValueError(f"num_bytes={num_bytes}, granularity={granularity}, max_chunks={max_chunks} must be positive")
    share = -(-num_bytes // max_chunks)
    return -(-share // granularity) * granularity


class ParkedWeights:
    def __init__(self, module: torch.nn.Module, chunk_bytes: int = 0) -> None:
        """``chunk_bytes``: the mapping's chunk; 0 picks ``weights_chunk``'s."""
        tensors = [t for t in (*module.parameters(), *module.buffers()) if t.numel()]
        devices = {t.device for t in tensors}
        if len(devices) != 1 or next(iter(devices)).type != "cuda":
            raise ValueError(
                f"the module's tensors must all live on one CUDA device (found {sorted(map(str, devices))})"
            )
        device = next(iter(devices))
        offsets, total = [], 0
        for t in tensors:
            offsets.append(total)
            total += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
        self.num_bytes = total
        driver = Driver(device.index or 0)
        self.buffer = VmmBuffer(driver, total, chunk_bytes or weights_chunk(total, driver.granularity()))
        self.buffer.map(0, total, zero=False)
        self._raw = self.buffer.tensor()
        for t, offset in zip(tensors, offsets, strict=True):
            view = self._raw[offset : offset + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            view.copy_(t)
            t.data = view  # the module's tensor now lives in the buffer; its old storage is freed below
        self.host = torch.empty(total, dtype=torch.uint8, pin_memory=True)
        self.host.copy_(self._raw[:total])
        torch.cuda.empty_cache()
        self.resident = True

    def offload(self) -> int:
        """Give the weights' device bytes back to the driver. Returns them."""
        if not self.resident:
            raise RuntimeError("the draft's weights are already offloaded")
        self.resident = False
        return self.buffer.unmap(0, self.buffer.size)

    def reload(self, stream: torch.cuda.Stream) -> torch.cuda.Event:
        """Map the weights' chunks again and copy them in on ``stream``; wait on the returned event before use."""
        if self.resident:
            raise RuntimeError("the draft's weights are resident")
        self.buffer.map(0, self.num_bytes, zero=False)
        done = torch.cuda.Event()
        with torch.cuda.stream(stream):
            self._raw[: self.num_bytes].copy_(self.host, non_blocking=True)
            done.record(stream)
        self.resident = True
        return done

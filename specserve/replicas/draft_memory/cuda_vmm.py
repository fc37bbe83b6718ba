"""Device memory at a fixed address whose chunks are mapped and unmapped at will: CUDA virtual memory management.

Address space is reserved once (``cuMemAddressReserve``); physical chunks of the driver's granularity (2 MiB on
an H100 and an H200) are created and mapped where memory is wanted (``cuMemCreate``, ``cuMemMap``,
``cuMemSetAccess``) and unmapped and released where it is not (``cuMemUnmap``, ``cuMemRelease``). A tensor over
the reservation keeps its address through every change, so CUDA graphs captured over it stay valid, and what
is unmapped returns to the driver's free memory at once, for any allocator to take. It is the GPU counterpart of
the anonymous mapping ``kv_reserve`` grows the KV cache in on a CPU, where the operating system backs pages on
first write and ``madvise`` gives them back; here mapping is explicit.

Verified on an H100 and an H200 with torch alone (``bench/gpu_vmm.py``, ``tests/gpu``): a gather captured as a
CUDA graph before a grow reads blocks mapped after it; on a GPU with less free memory than a draft, dropping the
draft frees its bytes to the driver and the buffer grows into them where a reallocated buffer does not fit.
PyTorch exposes none of these driver calls, so they are made through ``ctypes``.
"""

from __future__ import annotations

import ctypes
import math

import torch

# cuda.h enums (stable ABI).
_ALLOCATION_TYPE_PINNED = 1
_LOCATION_TYPE_DEVICE = 1
_ACCESS_READ_WRITE = 3
_GRANULARITY_MINIMUM = 0
_GRANULARITY_RECOMMENDED = 1


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _AllocationProp(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", _AllocFlags),
    ]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class Driver:
    """The CUDA driver calls virtual memory needs, for one device."""

    def __init__(self, device: int) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA virtual memory needs a CUDA device; none is visible to this process")
        torch.zeros(1, device=f"cuda:{device}")  # makes the device's primary context current for the driver
        self.lib = ctypes.CDLL("libcuda.so.1")
        u64, size = ctypes.c_uint64, ctypes.c_size_t
        signatures = {
            "cuMemGetAllocationGranularity": [ctypes.POINTER(size), ctypes.POINTER(_AllocationProp), ctypes.c_int],
            "cuMemAddressReserve": [ctypes.POINTER(u64), size, size, u64, u64],
            "cuMemAddressFree": [u64, size],
            "cuMemCreate": [ctypes.POINTER(u64), size, ctypes.POINTER(_AllocationProp), u64],
            "cuMemRelease": [u64],
            "cuMemMap": [u64, size, size, u64, u64],
            "cuMemUnmap": [u64, size],
            "cuMemSetAccess": [u64, size, ctypes.POINTER(_AccessDesc), size],
            "cuMemsetD8_v2": [u64, ctypes.c_ubyte, size],
            "cuGetErrorString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
        }
        for name, argtypes in signatures.items():
            getattr(self.lib, name).argtypes = argtypes
            getattr(self.lib, name).restype = ctypes.c_int
        self.device = device
        self.prop = _AllocationProp(type=_ALLOCATION_TYPE_PINNED, location=_Location(_LOCATION_TYPE_DEVICE, device))
        self.access = _AccessDesc(location=_Location(_LOCATION_TYPE_DEVICE, device), flags=_ACCESS_READ_WRITE)

    def __call__(self, name: str, *args: object) -> None:
        code = getattr(self.lib, name)(*args)
        if code:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(code, ctypes.byref(text))
            raise RuntimeError(f"{name} failed: {code} {(text.value or b'?').decode()}")

    def granularity(self, recommended: bool = True) -> int:
        out = ctypes.c_size_t()
        flag = _GRANULARITY_RECOMMENDED if recommended else _GRANULARITY_MINIMUM
        self("cuMemGetAllocationGranularity", ctypes.byref(out), ctypes.byref(self.prop), flag)
        return out.value


class VmmBuffer:
    """``reserve_bytes`` of address space (rounded up to whole chunks) over which chunks are mapped by byte range.

    ``chunk_bytes`` rounds up to the driver's granularity; bigger chunks mean fewer driver calls (a 2 GB grow took
    45 ms in 2 MiB chunks and 1.2 ms in 64 MiB ones on an H200) but coarser ranges.
    """

    def __init__(self, driver: Driver, reserve_bytes: int, chunk_bytes: int = 0) -> None:
        self.cu = driver
        grain = driver.granularity()
        self.chunk = math.ceil(max(chunk_bytes, grain) / grain) * grain
        self.size = math.ceil(reserve_bytes / self.chunk) * self.chunk
        address = ctypes.c_uint64()
        self.cu("cuMemAddressReserve", ctypes.byref(address), self.size, grain, 0, 0)
        self.address = address.value
        self._handles: dict[int, int] = {}  # chunk index -> its physical allocation

    @property
    def mapped_bytes(self) -> int:
        return len(self._handles) * self.chunk

    def is_mapped(self, start: int, end: int) -> bool:
        return all(i in self._handles for i in range(start // self.chunk, math.ceil(end / self.chunk)))

    def map(self, start: int, end: int, zero: bool = True) -> int:
        """Map every chunk that ``[start, end)`` touches and is not mapped yet (zeroed unless told otherwise).
        Returns the bytes newly mapped."""
        touched = range(start // self.chunk, math.ceil(min(end, self.size) / self.chunk))
        fresh = [i for i in touched if i not in self._handles]
        for index in fresh:
            handle = ctypes.c_uint64()
            self.cu("cuMemCreate", ctypes.byref(handle), self.chunk, ctypes.byref(self.cu.prop), 0)
            at = self.address + index * self.chunk
            try:
                self.cu("cuMemMap", at, self.chunk, 0, handle.value, 0)
                self.cu("cuMemSetAccess", at, self.chunk, ctypes.byref(self.cu.access), 1)
            except RuntimeError:
                self.cu("cuMemRelease", handle.value)
                raise
            self._handles[index] = handle.value
        for index in fresh if zero else []:  # new physical memory holds whatever was there before
            self.cu("cuMemsetD8_v2", self.address + index * self.chunk, 0, self.chunk)
        return len(fresh) * self.chunk

    def unmap(self, start: int, end: int) -> int:
        """Unmap the chunks lying wholly inside ``[start, end)``. Returns the bytes given back to the driver."""
        torch.cuda.synchronize(self.cu.device)  # no kernel may still touch what is unmapped
        gone = [i for i in range(math.ceil(start / self.chunk), end // self.chunk) if i in self._handles]
        for index in gone:
            self.cu("cuMemUnmap", self.address + index * self.chunk, self.chunk)
            self.cu("cuMemRelease", self._handles.pop(index))
        return len(gone) * self.chunk

    def tensor(self) -> torch.Tensor:
        """The whole reservation as uint8 at a fixed address; only mapped chunks may be touched."""
        if 0 not in self._handles:  # torch asks the driver which device the first byte lives on
            raise RuntimeError("map the first chunk before viewing the buffer")
        interface = {"shape": (self.size,), "typestr": "|u1", "data": (self.address, False), "version": 3}
        holder = type("VmmView", (), {"__cuda_array_interface__": interface})()
        return torch.as_tensor(holder, device=f"cuda:{self.cu.device}")

    def close(self) -> None:
        self.unmap(0, self.size)
        self.cu("cuMemAddressFree", self.address, self.size)

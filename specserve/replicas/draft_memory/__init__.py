"""Elastic draft memory's mechanism: the EngineCore side (``elastic_draft``, ``kv_pool``) and the worker side
(``worker``, ``kv_reserve``, ``cuda_vmm``, ``draft_vmm``). The decisions are the pure ``specserve.memory``."""

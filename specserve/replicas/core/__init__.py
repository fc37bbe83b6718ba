"""What runs inside vLLM's EngineCore process: the scheduler (``scheduler_cls``), its counters, the engine-path
check and specserve's EngineCore utility methods."""

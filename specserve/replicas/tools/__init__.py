"""A vLLM engine in this process, outside Ray Serve (measurements, ``doctor``, the engine tests)."""

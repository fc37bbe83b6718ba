"""What runs in vLLM's worker process(es): the worker extension (``worker_extension_cls``) and the model-runner
patches it installs."""

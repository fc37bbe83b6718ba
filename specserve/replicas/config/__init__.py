"""Engine configuration, free of vLLM, Ray and torch: built by the CLI, the config file and the public API, read
in every process."""

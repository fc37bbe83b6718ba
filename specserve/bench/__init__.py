"""The load generator: `specserve bench run` against any OpenAI-compatible endpoint.

`load` plans who sends what when (closed loop, Poisson/piecewise/bursty rates, trace replay), `prompts`
makes prompts of a token length, `workload` the mixed workload's copy-heavy and free-form requests (from
`mixed_bank.json`, which bench/mixed_bank.py builds), `client` sends them through vLLM's benchmark request
functions, `report` computes vLLM's metric definitions, `server_metrics` reads the server's acceptance counters,
and `cli` wires the flags.
"""

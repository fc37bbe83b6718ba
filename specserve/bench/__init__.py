"""The load generator: `specserve bench run` against any OpenAI-compatible endpoint.

`load` plans who sends what when (closed loop, Poisson/piecewise/bursty rates, trace replay), `prompts`
makes prompts of a token length, `client` sends them through vLLM's benchmark request functions,
`report` computes vLLM's metric definitions, and `cli` wires the flags.
"""

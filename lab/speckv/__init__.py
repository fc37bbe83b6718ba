"""SpecKV's training side: samples from simulator runs or step logs (``samples``, ``mlp_dump``), the synthetic data
behind the packaged default weights (``synthetic``) and the pure-Python trainer (``training``). The predictor itself
(``specserve.speculation.speckv.model``) and its default weights stay with the ``mlp`` policy."""

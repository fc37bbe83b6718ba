"""SpecKV's acceptance predictor: the MLP, its training, its samples format and the synthetic data behind the
packaged default weights (``default_weights.json``). The ``mlp`` policy uses it."""

"""SpecKV's acceptance predictor as the ``mlp`` policy runs it: the MLP and its packaged default weights
(``default_weights.json``). Training, the samples format and the synthetic data behind the defaults are research
tools and live in the lab (``lab/speckv``), outside the installed package."""

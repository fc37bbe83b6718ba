"""One module per policy; importing this package registers every policy under its name.

Pieces only policies use (argmax ties, probes, early stop, switching cost, ...) live in ``parts``.
"""

from specserve.speculation.policies import (  # noqa: F401 - imported to register
    adaptive,
    bandit,
    cycle,
    fixed,
    goodput,
    kld,
    mlp,
    slo,
    static_table,
    ucb,
)

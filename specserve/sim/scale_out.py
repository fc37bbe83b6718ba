"""Replicas that join the router during a run (``scale_out``), as Ray Serve's autoscaler adds them, and the prior
they start from.

Until ``at_s`` the router sends nothing to the last ``replicas`` replicas. Then they join, and with ``priors``
each starts from its peers' acceptance evidence averaged into one typical peer's worth (``pooled_evidence``), as
the controller hands an ``AcceptancePrior`` to a replica new to its deployment: the replica's telemetry estimate
and its policy's are seeded with it, as the engine's ``seed_acceptance`` does. Without ``priors`` a new replica's
policy starts from its cold prior.
"""

from __future__ import annotations

from specserve.sim.config import ScaleOutConfig
from specserve.sim.replica import Replica
from specserve.speculation import PositionAcceptance
from specserve.speculation.estimators.acceptance import pooled_evidence


class ScaleOut:
    def __init__(self, cfg: ScaleOutConfig, replicas: list[Replica]) -> None:
        self.cfg = cfg
        self.replicas = replicas
        self.serving = replicas[: len(replicas) - cfg.replicas]
        self.joining = replicas[len(replicas) - cfg.replicas :]
        self.prior: tuple[tuple[float, ...], tuple[float, ...], int] | None = None
        if cfg.priors:
            # The engine's telemetry estimator (the scheduler's, with its defaults): what the controller pools.
            for replica in replicas:
                replica.acceptance_evidence = PositionAcceptance(max_k=max(replica.cfg.max_k, 1))

    def join(self) -> list[Replica]:
        """The new replicas join; returns every replica, for the router."""
        if self.cfg.priors:
            peers = [
                (r.acceptance_evidence.accepted_counts(), r.acceptance_evidence.num_reached())
                for r in self.serving
                if r.acceptance_evidence is not None
            ]
            self.prior = pooled_evidence(peers)
            if self.prior is not None:
                accepted, reached, _ = self.prior
                for replica in self.joining:
                    assert replica.acceptance_evidence is not None
                    replica.acceptance_evidence.seed(accepted, reached)
                    replica.guard.seed_acceptance(accepted, reached)
        self.serving = self.replicas
        return self.replicas

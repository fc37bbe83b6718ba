"""Whether the cluster controller coordinates a replica, from its telemetry rounds (``server.py`` runs them)."""

from __future__ import annotations

# Rounds in a row without an answer after which the engine grants its own draft transfers (local rules).
LOCAL_RULES_AFTER_ROUNDS = 3


class ControllerLink:
    """The controller coordinates the replica until ``grace_rounds`` rounds in a row go unanswered (a push that
    timed out, no controller actor to push to). The grace keeps one slow push from handing the engine its own
    transfer grants for a round and taking them back the next, when the planner may have queued that very reload
    behind another replica's. Not coordinated before the first answer."""

    def __init__(self, grace_rounds: int = LOCAL_RULES_AFTER_ROUNDS) -> None:
        if grace_rounds < 1:
            raise ValueError(f"grace_rounds {grace_rounds}: must be at least 1")
        self.grace_rounds = grace_rounds
        self.missed = grace_rounds

    def round(self, answered: bool) -> bool:
        """Record one telemetry round; returns whether the controller coordinates the replica now."""
        self.missed = 0 if answered else self.missed + 1
        return self.coordinated

    @property
    def coordinated(self) -> bool:
        return self.missed < self.grace_rounds

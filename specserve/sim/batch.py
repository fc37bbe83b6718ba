"""Per-request state: the run-wide request table and one replica's running batch (struct of arrays).

The running batch is numpy arrays in admission order (vLLM's FCFS priority: the last row is preempted
first), so a step's arithmetic over the batch is a handful of vector operations, not a Python loop per
request; that is what makes a 10-minute trace at 20 QPS simulate in seconds.
"""

from __future__ import annotations

import numpy as np

from specserve.sim.workload import Workload


class RequestTable:
    """Everything known about every request of a run, indexed by request id (its workload row). Every attribute
    is one column, a value per request (``grow`` and ``truncate`` rely on it)."""

    def __init__(self, workload: Workload, alphas: np.ndarray, first_id: int = 0) -> None:
        n = len(workload)
        self.arrival_s = workload.arrival_s
        self.prompt_tokens = workload.prompt_tokens
        self.output_tokens = workload.output_tokens
        # The class its client gave it at arrival: batch work (True) or latency-sensitive (False).
        self.batch = workload.is_batch()
        # Stable id per request for policies that keep per-request state (StepContext.request_ids): its
        # workload row as a string, in an object array so a batch's ids are one fancy index away.
        self.request_ids = np.array([str(i) for i in range(first_id, first_id + n)], dtype=object)
        # The request's own acceptance rate at draft position 0 (true_acceptance.TrueAcceptance).
        self.alpha = alphas
        # Output tokens generated so far; kept here while the request is not running (waiting after a
        # preemption keeps its output and recomputes its KV on return).
        self.num_output = np.zeros(n, dtype=np.int64)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.num_preemptions = np.zeros(n, dtype=np.int64)
        self.replica = np.full(n, -1, dtype=np.int64)

    def grow(self, more: Workload, alphas: np.ndarray) -> None:
        """Append requests (a closed loop draws its requests as its clients send them)."""
        fresh = RequestTable(more, alphas, first_id=len(self.arrival_s))
        for name, column in list(vars(self).items()):
            setattr(self, name, np.concatenate((column, getattr(fresh, name))))

    def truncate(self, count: int) -> None:
        """Keep the first ``count`` requests."""
        for name, column in list(vars(self).items()):
            setattr(self, name, column[:count])


class Column:
    """A live view of one of a table's columns, for a holder that must see the table grow (the router)."""

    def __init__(self, table: RequestTable, name: str) -> None:
        self._table, self._name = table, name

    def __getitem__(self, index: int) -> object:
        return getattr(self._table, self._name)[index]


class RunningBatch:
    """The requests one replica has admitted, one row each, in priority order."""

    __slots__ = (
        "ids",
        "prompt",
        "max_output",
        "num_output",
        "num_computed",
        "num_blocks",
        "alpha",
        "draft_lag",
        "proposed",
    )

    def __init__(self) -> None:
        self.ids = np.zeros(0, dtype=np.int64)
        self.prompt = np.zeros(0, dtype=np.int64)
        self.max_output = np.zeros(0, dtype=np.int64)
        # Output tokens generated so far.
        self.num_output = np.zeros(0, dtype=np.int64)
        # Tokens whose KV is in the cache (vLLM's num_computed_tokens).
        self.num_computed = np.zeros(0, dtype=np.int64)
        # KV blocks held; a block holds the target's and the draft's KV for block_size tokens.
        self.num_blocks = np.zeros(0, dtype=np.int64)
        self.alpha = np.zeros(0, dtype=np.float64)
        # Tokens computed in steps that skipped the draft pass (k = 0 decode steps, as the engine skips
        # them); the next pass catches up on all but the last (replica._catch_up), which is Nightjar's
        # re-prefill switching cost (§5.2, Table 3).
        self.draft_lag = np.zeros(0, dtype=np.int64)
        # Drafts the last step proposed for the row, which the next verifies (``EngineConfig.drafts_ahead``).
        self.proposed = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.ids)

    def extend(self, ids: list[int], table: RequestTable) -> None:
        """Append newly admitted requests, with no KV yet."""
        rows = np.asarray(ids, dtype=np.int64)
        zeros = np.zeros(len(rows), dtype=np.int64)
        self.ids = np.concatenate((self.ids, rows))
        self.prompt = np.concatenate((self.prompt, table.prompt_tokens[rows]))
        self.max_output = np.concatenate((self.max_output, table.output_tokens[rows]))
        self.num_output = np.concatenate((self.num_output, table.num_output[rows]))
        self.num_computed = np.concatenate((self.num_computed, zeros))
        self.num_blocks = np.concatenate((self.num_blocks, zeros))
        self.alpha = np.concatenate((self.alpha, table.alpha[rows]))
        self.draft_lag = np.concatenate((self.draft_lag, zeros))
        self.proposed = np.concatenate((self.proposed, zeros))

    def keep(self, mask: np.ndarray | slice) -> None:
        """Keep the rows where mask is True (a boolean array or a slice)."""
        for name in self.__slots__:
            setattr(self, name, getattr(self, name)[mask])

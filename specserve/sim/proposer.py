"""What the simulated proposer does per step, by speculative method (``speculation.methods``, shared with the engine).

- ``draft_model``: a separate draft model; k draft passes per step, its own KV (one block table with the target's),
  and at k = 0 a sync pass or, where the engine skips it (``engine.k0_runs_draft_pass: false``), a catch-up of the
  skipped tokens when k > 0 resumes.
- ``eagle`` / ``eagle3`` / ``mtp``: a head over the target's hidden states; k passes per step and a KV of its one
  layer, like a small draft model, but its pass runs at k = 0 too (a skipped step's hidden states are gone).
- ``ngram`` (prompt lookup): no weights and no KV; one lookup per step finds all k drafts whatever k is, priced by
  the pair's ``lookup`` fit; at k = 0 nothing runs and nothing is left to catch up.

TurboSpec §6 (Figure 12) measures the proposals' share of a Llama-3-8B step: about 17.7 % for three EAGLE tokens,
5 % for prompt lookup; the profiles in ``profiles/pairs.yaml`` say where each pair's costs come from.
"""

from __future__ import annotations

from dataclasses import dataclass

from specserve.sim.config import EngineConfig
from specserve.speculation.methods import K0, Method, Source, method


@dataclass(frozen=True, slots=True)
class Proposer:
    method: Method
    # A decode step at k = 0 runs the proposer's pass (priced like any pass).
    k0_runs_pass: bool

    @property
    def catches_up(self) -> bool:
        """A step the proposer sat out leaves its KV behind, and the next pass catches it up."""
        return self.method.catches_up() and not self.k0_runs_pass

    @property
    def one_pass(self) -> bool:
        """One pass per step finds every draft (a lookup), instead of one pass per draft."""
        return self.method.source is Source.NONE

    def lookup_passes(self, k: int, num_scheduled: int) -> list[int]:
        """A lookup's passes (``one_pass``) on a step at ``k``, as the tokens each reads: one search for every
        scheduled request, none at k = 0. The replica runs them and the oracle prices them."""
        return [num_scheduled] if k > 0 else []

    @property
    def has_weights(self) -> bool:
        """The proposer holds weights and a KV cache on the device (a draft model or a head)."""
        return self.method.source in (Source.DRAFT_MODEL, Source.HEAD)


def proposer_for(method_name: str, engine: EngineConfig) -> Proposer:
    """The proposer of ``method_name`` on ``engine``: the method decides k = 0 where it allows one way only."""
    m = method(method_name)
    k0_runs = {K0.RUN: True, K0.SKIP: False}.get(m.k0, engine.k0_runs_draft_pass)
    return Proposer(m, k0_runs)

"""The start-up calibration a served replica runs before it serves, simulated: the same runs, on the simulated
engine, so that a simulated policy starts where a served one does.

A served replica (``specserve.replicas.serve.calibration``) runs ``startup_checks.plan``'s probes, each a batch of
dummy requests under ``fixed:k=K``, and warm-starts its policy from the steps' costs, their acceptance left out
(``without_acceptance``). Here each probe is a run of the same scenario on one replica with that batch as a closed
loop's single wave, under the same k; the steps it records, in the plan's order, are the history every replica's
policy is warm-started from (``EngineConfig.startup_calibration``). The simulated engine has no one-off first
steps, so the served calibration's warm-up request has no counterpart.
"""

from __future__ import annotations

from specserve.sim.config import EngineConfig, Scenario
from specserve.speculation.startup_checks import CALIBRATION_MAX_TOKENS, CALIBRATION_PROMPT_TOKENS, Probe, plan

# A closed loop's phase this short sends each client's first request and nothing after.
ONE_WAVE_S = 1e-6
# A scenario's parts a calibration does not depend on: the traffic and the cluster around the engine.
NOT_THE_ENGINE = {"num_replicas", "router", "workload", "slo", "memory", "scale_out"}


def planned_probes(engine: EngineConfig) -> list[Probe]:
    """The engine's calibration plan, as a served replica's: none where it does not speculate."""
    return plan(engine.max_k, engine.max_num_seqs) if engine.max_k >= 1 else []


def probe_scenarios(scenario: Scenario, probes: list[Probe]) -> list[tuple[Probe, Scenario]]:
    """Per probe, the scenario that runs it: ``scenario``'s hardware, pair, engine and acceptance, one replica with
    its draft resident, ``probe.batch`` dummy requests of the calibration's lengths."""
    lengths = {
        "prompt_tokens": {"mean": CALIBRATION_PROMPT_TOKENS, "std": 0},
        "output_tokens": {"mean": CALIBRATION_MAX_TOKENS, "std": 0},
    }
    out = []
    for probe in probes:
        workload = {
            "lengths": lengths,
            "arrivals": {"kind": "clients", "phases": [{"clients": probe.batch, "duration_s": ONE_WAVE_S}]},
        }
        raw = scenario.model_dump(exclude=NOT_THE_ENGINE)
        raw["name"] = f"{scenario.name}-calibration-k{probe.k}-b{probe.batch}"
        raw["engine"] = {**raw["engine"], "startup_calibration": False}
        raw["workload"] = workload
        out.append((probe, Scenario.model_validate(raw)))
    return out

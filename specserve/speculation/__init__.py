"""Speculation-length policies: pure Python over typed records, no ray, vllm, torch or prometheus_client.

- ``types``: the messages across the policy boundary (``EngineTraits``, ``StepContext``, ``Decision`` with its
  optional ``DraftStop``, ``StepRecord``).
- ``policy``: the ``Policy`` interface, the registry by name and ``NAME[:key=value,...]`` specs.
- ``guard``: ``GuardedPolicy``, through which the engine and the simulator call a policy: a policy that raises or
  answers nonsense costs a k = 0 step and an error count, never the engine.
- ``policies``: one module per policy (fixed, cycle, static-table, goodput, adaptive, bandit, ucb, slo, kld,
  mlp); ``policies.parts`` holds the pieces only policies use.
- ``estimators``: what policies learn online: acceptance per draft position, step latency, the per-bucket
  correction of step latency, AdaSpec's SLO-aware efficiency.
- ``speckv``: SpecKV's acceptance predictor (the MLP and its default weights; its training is in the lab,
  ``lab/speckv``).

``make_policy("goodput:max_k=4", EngineTraits(max_k=4))`` builds one by name; ``adaptive`` is the project's
default (TurboSpec's goodput argmax with a piecewise-linear step cost, prefill priced at the margin, and
hysteresis).
"""

# Importing the policy modules registers every policy by name.
from specserve.speculation.estimators.acceptance import PositionAcceptance, expected_tokens
from specserve.speculation.guard import GuardedPolicy
from specserve.speculation.policies.adaptive import AdaptiveParams, AdaptivePolicy
from specserve.speculation.policies.bandit import BanditParams, BanditPolicy
from specserve.speculation.policies.cycle import CycleParams, CyclePolicy
from specserve.speculation.policies.fixed import FixedParams, FixedPolicy
from specserve.speculation.policies.goodput import GoodputParams, GoodputPolicy
from specserve.speculation.policies.kld import KldParams, KldPolicy
from specserve.speculation.policies.mlp import MlpParams, MlpPolicy
from specserve.speculation.policies.parts.switching import SwitchCostTable
from specserve.speculation.policies.slo import SloParams, SloPolicy
from specserve.speculation.policies.static_table import StaticTableParams, StaticTablePolicy
from specserve.speculation.policies.ucb import UcbParams, UcbPolicy
from specserve.speculation.policy import Policy, alias, make_policy, parse_spec, policy_names, register, split_specs
from specserve.speculation.types import Decision, DraftStop, EngineTraits, StepContext, StepRecord

__all__ = [
    "AdaptiveParams",
    "AdaptivePolicy",
    "BanditParams",
    "BanditPolicy",
    "CycleParams",
    "CyclePolicy",
    "PositionAcceptance",
    "expected_tokens",
    "Decision",
    "DraftStop",
    "EngineTraits",
    "FixedParams",
    "FixedPolicy",
    "GoodputParams",
    "GuardedPolicy",
    "GoodputPolicy",
    "KldParams",
    "KldPolicy",
    "MlpParams",
    "MlpPolicy",
    "Policy",
    "SloParams",
    "SloPolicy",
    "StaticTableParams",
    "StaticTablePolicy",
    "StepContext",
    "StepRecord",
    "SwitchCostTable",
    "UcbParams",
    "UcbPolicy",
    "alias",
    "make_policy",
    "parse_spec",
    "policy_names",
    "register",
    "split_specs",
]

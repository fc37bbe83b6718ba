"""Speculation-length policies: pure Python over typed records, no ray, vllm, torch or prometheus_client.

``make_policy("goodput:k_max=4", EngineTraits(max_k=4))`` builds one by name; ``adaptive`` is the
project's default (adaptive.py: TurboSpec's goodput argmax with a piecewise-linear step cost, prefill priced
at the margin, and hysteresis).
"""

from specserve.speculation.estimators.acceptance import PositionAcceptance, expected_tokens
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
from specserve.speculation.policy import Policy, alias, make_policy, parse_spec, policy_names, register
from specserve.speculation.speckv.training import train_mlp
from specserve.speculation.types import Decision, EngineTraits, StepContext, StepRecord

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
    "EngineTraits",
    "FixedParams",
    "FixedPolicy",
    "GoodputParams",
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
    "train_mlp",
]

"""Speculation-length policies: pure Python over typed records, no ray, vllm, torch or prometheus_client.

``make_policy("goodput:k_max=4", EngineTraits(max_k=4))`` builds one by name; ``adaptive`` is the
project's default (adaptive.py: TurboSpec's goodput argmax with a piecewise-linear step cost, prefill priced
at the margin, and hysteresis).
"""

# Importing a policy module registers its policy by name.
from specserve.speculation.acceptance import PositionAcceptance, expected_tokens
from specserve.speculation.adaptive import AdaptiveParams, AdaptivePolicy
from specserve.speculation.bandit import BanditParams, BanditPolicy
from specserve.speculation.cycle import CycleParams, CyclePolicy
from specserve.speculation.fixed import FixedParams, FixedPolicy
from specserve.speculation.goodput import GoodputParams, GoodputPolicy
from specserve.speculation.kld import KldParams, KldPolicy
from specserve.speculation.mlp import MlpParams, MlpPolicy
from specserve.speculation.mlp_fit import train_mlp
from specserve.speculation.policy import Policy, alias, make_policy, parse_spec, policy_names, register
from specserve.speculation.slo import SloParams, SloPolicy
from specserve.speculation.static_table import StaticTableParams, StaticTablePolicy
from specserve.speculation.switching import SwitchCostTable
from specserve.speculation.types import Decision, EngineTraits, StepContext, StepRecord
from specserve.speculation.ucb import UcbParams, UcbPolicy

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

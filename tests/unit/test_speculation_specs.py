"""Policy specs (``NAME[:key=value,...]``), the registry, and FixedPolicy."""

from __future__ import annotations

import pytest

from specserve.speculation import (
    EngineTraits,
    FixedPolicy,
    GoodputPolicy,
    StepContext,
    make_policy,
    parse_spec,
    policy_names,
)

TRAITS = EngineTraits(max_k=4)
CTX = StepContext(now_s=0.0, num_running=4, num_waiting=0, num_context_tokens=4000)


def test_fixed_spec() -> None:
    policy = make_policy("fixed:k=3", TRAITS)
    assert isinstance(policy, FixedPolicy)
    assert policy.choose(CTX).k == 3


def test_fixed_zero_is_plain_decoding_and_no_draft_means_zero() -> None:
    assert make_policy("fixed:k=0", TRAITS).choose(CTX).k == 0
    absent = StepContext(now_s=0.0, num_running=4, num_waiting=0, num_context_tokens=4000, draft_resident=False)
    assert make_policy("fixed:k=2", TRAITS).choose(absent).k == 0


def test_fixed_k_above_engine_max_names_both() -> None:
    with pytest.raises(ValueError, match=r"k=5.*max_k=4"):
        make_policy("fixed:k=5", TRAITS)


def test_goodput_spec_sets_params() -> None:
    policy = make_policy("goodput:max_k=2,probe_interval_s=1.5", TRAITS)
    assert isinstance(policy, GoodputPolicy)
    assert (policy.params.max_k, policy.params.probe_interval_s) == (2, 1.5)
    assert policy.params.prior_alpha == 0.5  # untouched defaults stay


def test_every_policy_module_registers_its_policy() -> None:
    names = {"fixed", "cycle", "static-table", "goodput", "adaptive", "bandit", "ucb", "slo", "kld", "mlp"}
    assert names <= set(policy_names())
    assert {make_policy(name, TRAITS).name for name in names} == names


@pytest.mark.parametrize("spec", ["fixed", "fixed:k=2", "goodput", "goodput:max_k=3,prior_alpha=0.7", "adaptive"])
def test_spec_round_trips(spec: str) -> None:
    policy = make_policy(spec, TRAITS)
    rebuilt = make_policy(policy.spec, TRAITS)
    assert type(rebuilt) is type(policy) and rebuilt.params == policy.params
    assert rebuilt.spec == policy.spec


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("nosuch:k=1", "nosuch"),  # unknown policy
        ("fixed:kk=1", "kk"),  # unknown key
        ("fixed:k=three", "three"),  # not an int
        ("goodput:probe_interval_s=soon", "probe_interval_s"),
        ("fixed:k=-1", "k=-1"),  # parses, fails validation
        ("goodput:prior_alpha=1.5", "prior_alpha"),
        ("goodput:probe_k=0", "probe_k"),
        ("fixed:k", "'k'"),  # not key=value
    ],
)
def test_bad_specs_raise_value_error_naming_the_problem(spec: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make_policy(spec, TRAITS)


def test_simulator_only_policies_are_refused_with_the_reason() -> None:
    """The engine (scheduler.set_policy), serve's config and `policy set` all build policies with make_policy."""
    with pytest.raises(ValueError, match="policy 'oracle' runs only in the simulator: it reads each request's true"):
        make_policy("oracle", TRAITS)
    with pytest.raises(ValueError, match="runs only in the simulator"):
        make_policy("oracle:max_k=2", TRAITS)
    assert "oracle" not in policy_names()


def test_parse_spec() -> None:
    assert parse_spec(" goodput : max_k=2 , probe_k=1 ") == ("goodput", {"max_k": "2", "probe_k": "1"})
    assert parse_spec("fixed") == ("fixed", {})


def test_cycle_policy_repeats_its_sequence():
    from specserve.speculation import EngineTraits, StepContext, make_policy

    policy = make_policy("cycle:ks=4-0-2", EngineTraits(max_k=4))
    ctx = StepContext(now_s=0.0, num_running=1, num_waiting=0, num_context_tokens=10)
    assert [policy.choose(ctx).k for _ in range(7)] == [4, 0, 2, 4, 0, 2, 4]
    for bad in ("cycle:ks=4-x", "cycle:ks=9"):
        with pytest.raises(ValueError, match="ks|max_k"):
            make_policy(bad, EngineTraits(max_k=4))


CAPPED = ["adaptive", "goodput", "slo", "bandit", "ucb"]  # the policies with a max_k parameter


@pytest.mark.parametrize("name", CAPPED)
def test_old_k_max_spelling_is_read_as_max_k_with_a_warning(name: str) -> None:
    with pytest.warns(DeprecationWarning, match=f"policy '{name}': k_max is now max_k"):
        old = make_policy(f"{name}:k_max=2", TRAITS)
    new = make_policy(f"{name}:max_k=2", TRAITS)
    assert type(old) is type(new) and old.params == new.params
    assert old.spec == new.spec == f"{name}:max_k=2"
    with pytest.raises(ValueError, match="k_max is the old name of max_k; give max_k only"):
        make_policy(f"{name}:k_max=2,max_k=3", TRAITS)


def test_k_max_is_not_renamed_for_a_policy_without_max_k() -> None:
    with pytest.raises(ValueError, match="policy 'fixed' has no parameter 'k_max'"):
        make_policy("fixed:k_max=2", TRAITS)


# The papers' policies keep their papers' caps (TurboSpec's MAX_LEN 4, AdaSpec's preset 8, the bandits' 4);
# adaptive, ours, follows the engine's.
DEFAULT_CAPS = {"adaptive": None, "goodput": 4, "slo": 8, "bandit": 4, "ucb": 4}


@pytest.mark.parametrize("name", CAPPED)
def test_max_k_defaults_to_the_papers_or_the_engines_and_a_given_one_is_capped_by_the_engine(name: str) -> None:
    engine = EngineTraits(max_k=10)
    default = DEFAULT_CAPS[name]
    assert make_policy(name, engine).params.max_k == default
    searched = [make_policy(spec, engine).max_k for spec in (name, f"{name}:max_k=3", f"{name}:max_k=12")]
    assert searched == [10 if default is None else default, 3, 10]
    with pytest.raises(ValueError, match="max_k=-1 "):
        make_policy(f"{name}:max_k=-1", engine)


def test_adaptive_without_max_k_searches_up_to_the_engines() -> None:
    """A perfect-acceptance prior on one request takes the largest k searched: the engine's 10, where adaptive's own
    default of 8 stopped it before max_k followed the engine."""
    ctx = StepContext(now_s=0.0, num_running=1, num_waiting=0, num_context_tokens=100)
    engine = EngineTraits(max_k=10)
    assert make_policy("adaptive:prior_alpha=1.0", engine).choose(ctx).k == 10
    assert make_policy("adaptive:prior_alpha=1.0,max_k=8", engine).choose(ctx).k == 8

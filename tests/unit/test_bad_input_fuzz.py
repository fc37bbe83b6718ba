"""Property-based bad input for the surfaces that take text from users without a cluster: the serve config file,
`policy set` specs and simulator scenario files. Every input either builds or raises the surface's own error
(ConfigError, ValueError/CommandError, ScenarioError) with a message naming the bad part; never another exception.
The counts of inputs tried are the ``max_examples`` below (docs/user-guide/reliability.md states them)."""

from __future__ import annotations

import dataclasses
import math
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from specserve.cluster.config import LEGACY_KEYS, SECTIONS, ConfigError, ServeConfig, load_config
from specserve.cluster.control import CommandError, canonical_policy
from specserve.sim.config import Scenario
from specserve.sim.scenario import ScenarioError, builtin_scenarios, parse_scenario, resolve
from specserve.speculation import EngineTraits, make_policy, policy_names
from specserve.speculation.policy import _REGISTRY, SIMULATOR_ONLY

CONFIG_EXAMPLES = 1000
POLICY_EXAMPLES = 1500
SCENARIO_EXAMPLES = 1000

FUZZ = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
ANY_YAML = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
# policy_modules names modules to import: arbitrary names could import something with side effects.
SAFE_MODULES = st.lists(st.sampled_from(["no_such_module_xyz", "", "specserve.nope", "1bad"]), max_size=2)


@st.composite
def config_files(draw: st.DrawFn) -> str:
    if draw(st.booleans()) and draw(st.booleans()):  # a quarter: text that may not be YAML at all
        return draw(st.text(max_size=60))
    # Top-level keys, a section's keys (as "section.key") and the flat keys of earlier releases.
    keys = sorted(
        {*ServeConfig.model_fields, *LEGACY_KEYS}
        | {f"{name}.{key}" for name, section in SECTIONS.items() for key in section.model_fields}
    )
    keys.remove("policy_modules")
    keys.remove("speculation.policy_modules")
    data: dict = {}
    for key in draw(st.lists(st.sampled_from(keys), min_size=1, max_size=4, unique=True)):
        value = draw(ANY_YAML | st.just(-1) | st.just(0) | st.just(2**64))
        section, _, inner = key.partition(".")
        if inner and isinstance(data.get(section, {}), dict):
            data.setdefault(section, {})[inner] = value
        else:
            data[key] = value
    if draw(st.booleans()):
        data["speculation" if draw(st.booleans()) else "policy_modules"] = (
            {"policy_modules": draw(SAFE_MODULES)} if "speculation" not in data else draw(SAFE_MODULES)
        )
    if draw(st.integers(0, 9)) == 0:
        data[draw(st.text(min_size=1, max_size=8))] = 1
    return yaml.safe_dump(data)


@settings(FUZZ, max_examples=CONFIG_EXAMPLES)
@seed(13)
@given(text=config_files())
def test_a_bad_config_file_raises_config_error_naming_the_key(text: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "serve.yaml"
        path.write_text(text, errors="surrogatepass")
        try:
            config = load_config(str(path), {})
        except ConfigError as exc:
            message = str(exc)
            assert message.startswith(f"--config {path}: ")
            loaded = _safe_load(text)
            if isinstance(loaded, dict) and loaded:
                # Each line names a key of the file (or, for a model-level check, the keys it is about).
                named = {
                    *map(str, loaded),
                    *map(repr, loaded),
                    *ServeConfig.model_fields,
                    *(LEGACY_KEYS[key] for key in loaded if key in LEGACY_KEYS),
                    "(whole config)",
                } - {""}
                for line in message.splitlines():
                    where = line.removeprefix(f"--config {path}: ")
                    assert any(where.startswith(name) for name in named), line
            return
    # Accepted: then every value is one the serve can use.
    for name, value in config.model_dump().items():
        if isinstance(value, float):
            assert math.isfinite(value), f"{name}={value} accepted"


def _safe_load(text: str) -> object:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


NAMES = [*policy_names(), *SIMULATOR_ONLY]
PARAM_KEYS = sorted({f.name for cls in _REGISTRY.values() for f in dataclasses.fields(cls.Params)})
VALUES = (
    st.sampled_from(["nan", "inf", "-inf", "1e309", "-1", "0", "1", "0.5", "2", "100", "true", "", str(2**64), "x"])
    | st.integers(min_value=-(2**70), max_value=2**70).map(str)
    | st.floats().map(repr)
    | st.text(max_size=6)
)


@st.composite
def policy_specs(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=30))
    name = draw(st.sampled_from(NAMES) | st.text(max_size=8))
    keys = draw(st.lists(st.sampled_from(PARAM_KEYS) | st.text(max_size=5), max_size=3))
    params = ",".join(f"{key}={draw(VALUES)}" for key in keys)
    return f"{name}:{params}" if params else name


@settings(FUZZ, max_examples=POLICY_EXAMPLES)
@seed(13)
@given(spec=policy_specs(), max_k=st.integers(1, 16))
def test_a_bad_policy_spec_raises_an_error_naming_the_bad_part(spec: str, max_k: int) -> None:
    try:
        policy = make_policy(spec, EngineTraits(max_k=max_k))
    except ValueError as exc:
        assert str(exc), spec
        try:
            canonical_policy(spec, {max_k})
        except CommandError as command_error:
            assert str(command_error) == str(exc)
        else:
            raise AssertionError(f"make_policy refused {spec!r} but `policy set` would queue it")
        return
    for field in dataclasses.fields(policy.params):
        value = getattr(policy.params, field.name)
        if isinstance(value, float):
            assert math.isfinite(value), f"{spec!r}: {field.name}={value} accepted"


BUILTIN = {name: yaml.safe_load(path.read_text()) for name, path in builtin_scenarios().items()}


def _paths(value: object, prefix: tuple = ()) -> list[tuple]:
    if isinstance(value, dict):
        return [prefix] + [p for key, item in value.items() for p in _paths(item, (*prefix, key))]
    if isinstance(value, list):
        return [prefix] + [p for i, item in enumerate(value) for p in _paths(item, (*prefix, i))]
    return [prefix]


@st.composite
def scenario_dicts(draw: st.DrawFn) -> dict:
    """A built-in scenario with one to three of its values replaced, removed, or an unknown key added."""
    name = draw(st.sampled_from(sorted(BUILTIN)))
    raw = yaml.safe_load(yaml.safe_dump(BUILTIN[name]))
    raw.setdefault("name", name)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from([p for p in _paths(raw) if p]))
        parent = raw
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "replace", "delete", "unknown"]))
        if action == "replace":
            parent[path[-1]] = draw(ANY_YAML | st.sampled_from([-1, 0, 2**64, float("nan"), float("inf"), ""]))
        elif action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=6))] = 1
    return raw


@settings(FUZZ, max_examples=SCENARIO_EXAMPLES)
@seed(13)
@given(raw=scenario_dicts())
def test_a_bad_scenario_raises_scenario_error_naming_the_field(raw: dict) -> None:
    try:
        scenario = parse_scenario(raw, source="fuzzed.yaml")
    except ScenarioError as exc:
        message = str(exc)
        assert message.startswith("scenario 'fuzzed.yaml': "), message
        return
    assert isinstance(scenario, Scenario)
    try:
        resolve(scenario)
    except ScenarioError as exc:
        assert str(exc)


@pytest.mark.parametrize(("text", "named"), [("?\n", "None"), ("1: 2\n", "1"), ("2026-11-29: x\n", "datetime.date")])
def test_a_key_that_is_not_a_name_is_a_config_error_naming_it(tmp_path, text, named):
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"--config {path}: {named}.*: a key must be a name"):
        load_config(str(path), {})

"""The vLLM surface specserve patches, against the pinned vLLM: every symbol a patch module says it replaces
(``TARGETS``) exists, the methods it adds (``ADDED``) are not vLLM's, importing the runtime patches nothing, and
each ``install()`` patches once however often it runs. A vLLM upgrade that moves a patched symbol fails here by name,
not in an engine."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from types import ModuleType

import pytest

import specserve.replicas
from specserve.replicas import vllm_hooks


def runtime_modules() -> list[str]:
    return [
        m.name
        for m in pkgutil.walk_packages(specserve.replicas.__path__, "specserve.replicas.")
        if not m.name.endswith("__main__")
    ]


def patch_modules() -> list[ModuleType]:
    modules = [importlib.import_module(name) for name in runtime_modules()]
    return [m for m in modules if hasattr(m, "TARGETS")]


PATCH_MODULES = patch_modules()
TARGETS = sorted(t for m in PATCH_MODULES for t in m.TARGETS)
ADDED = sorted(t for m in PATCH_MODULES for t in getattr(m, "ADDED", ()))


def test_every_patch_module_installs_and_names_its_targets() -> None:
    names = {m.__name__.removeprefix("specserve.replicas.") for m in PATCH_MODULES}
    assert names == {
        "core.utilities",
        "worker.draft_signals",
        "worker.extension",
        "worker.plain_step",
        "worker.sampler_guard",
        "worker.shape_warmup",
        "worker.step_timing",
    }
    assert all(callable(getattr(m, "install", None)) for m in PATCH_MODULES)
    assert len(TARGETS) == len(set(TARGETS)), "two modules replace one symbol"
    assert (len(TARGETS), len(ADDED)) == (12, 11)


@pytest.mark.parametrize("target", TARGETS)
def test_each_replaced_symbol_exists_at_the_pinned_vllm(target: str) -> None:
    owner, name = vllm_hooks.resolve(target)
    assert callable(getattr(owner, name)), f"{target}: not in this vLLM"


# Run in a fresh interpreter: vLLM's attributes before and after importing every runtime module, then after one and
# after two rounds of every install().
_PROBE = """
import importlib, json, sys
from specserve.replicas import vllm_hooks
targets, added, modules = json.loads(sys.argv[1])

def ids():
    out = {}
    for t in targets + added:
        owner, name = vllm_hooks.resolve(t)
        value = vars(owner).get(name) if isinstance(owner, type) else getattr(owner, name, None)
        out[t] = None if value is None else id(value)
    return out

before = ids()
loaded = [importlib.import_module(m) for m in modules]
after_import = ids()
installs = [m.install for m in loaded if hasattr(m, "TARGETS")]
for install in installs:
    install()
once = ids()
for install in installs:
    install()
twice = ids()
print(json.dumps([before, after_import, once, twice]))
"""


@pytest.fixture(scope="module")
def probe() -> list[dict[str, int | None]]:
    args = json.dumps([TARGETS, ADDED, runtime_modules()])
    out = subprocess.run([sys.executable, "-c", _PROBE, args], capture_output=True, text=True, check=True)
    result: list[dict[str, int | None]] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_importing_the_runtime_leaves_vllm_untouched(probe: list[dict[str, int | None]]) -> None:
    before, after_import, _, _ = probe
    assert {t for t in before if before[t] != after_import[t]} == set()
    assert {t for t in TARGETS if before[t] is None} == set(), "a target vLLM lacks"
    assert {t for t in ADDED if before[t] is not None} == set(), "a method specserve adds that vLLM has"


def test_install_patches_every_target_once(probe: list[dict[str, int | None]]) -> None:
    before, _, once, twice = probe
    assert {t for t in TARGETS + ADDED if once[t] == before[t]} == set(), "an install left a target alone"
    assert once == twice


def test_the_worker_installs_its_patches_when_it_resolves_the_extension_as_vllm_does() -> None:
    code = """
from vllm.utils.import_utils import resolve_obj_by_qualname
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from specserve.replicas.config.engine_args import WORKER_EXTENSION_CLS
from specserve.replicas.worker import extension
before = GPUModelRunner.propose_draft_token_ids
cls = resolve_obj_by_qualname(WORKER_EXTENSION_CLS)
print(cls is extension.DraftSkipWorkerExtension, before is not extension._propose_or_skip,
      GPUModelRunner.propose_draft_token_ids is extension._propose_or_skip)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "True"]

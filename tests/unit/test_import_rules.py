"""The import rules of docs/architecture.md ("What may import what"), checked on every module.

A static scan finds every import statement, including those inside functions; a second check imports
the pure packages in a fresh interpreter and looks for frameworks that arrived transitively. The lab (``lab/``, the
research tools outside the installed package) imports the product; nothing in the product imports the lab.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "specserve"
LAB_ROOT = PACKAGE_ROOT.parent / "lab"
FRAMEWORKS = ("ray", "vllm", "torch", "prometheus_client")
PACKAGES = (
    "speculation",
    "memory",
    "messages",
    "sim",
    "replicas",
    "controller",
    "cluster",
    "models",
    "bench",
)


def ours(*names: str) -> tuple[str, ...]:
    return tuple(f"specserve.{name}" for name in names)


def all_ours_but(*allowed: str) -> tuple[str, ...]:
    return ours(*(p for p in PACKAGES if p not in allowed))


# Package -> import prefixes it must never use.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "speculation": (*FRAMEWORKS, *all_ours_but("speculation")),
    # The pure planner answers in the controller's message types, and its states are the telemetry's.
    "memory": (*FRAMEWORKS, *all_ours_but("memory", "messages")),
    "messages": (*FRAMEWORKS, *all_ours_but("messages", "speculation")),
    "sim": (*FRAMEWORKS, *all_ours_but("sim", "speculation", "memory", "messages")),
    # vLLM's private hooks live in replicas/ only; replicas and the controller talk through messages. The
    # controller plans draft transfers with the pure planner the simulator runs too.
    "replicas": ours("cluster", "sim", "models"),
    "controller": ("vllm", "torch", *all_ours_but("controller", "messages", "memory")),
    "models": ("vllm", "ray", *ours("controller", "cluster", "sim", "speculation")),
    "cluster": ("vllm",),
    # The load generator talks HTTP to any endpoint: of vLLM only its benchmark helpers (checked below), of ours
    # only the simulator's trace loader.
    "bench": ("ray", "torch", "prometheus_client", *all_ours_but("bench", "sim")),
}
# Within an allowed package, the only modules a package may import.
ONLY: dict[str, dict[str, tuple[str, ...]]] = {
    # A replica starts the cluster's controller where no one has (however the application was deployed) and its
    # node's agent where it batches its pushes, and otherwise talks to them through messages.
    "replicas": {"specserve.controller": ("specserve.controller.actor", "specserve.controller.node_agent")},
    "bench": {
        "vllm": ("vllm.benchmarks",),
        "specserve.sim": ("specserve.sim.workload", "specserve.sim.profiles"),
    },
}


def imported_modules(path: Path, root: Path = PACKAGE_ROOT) -> set[str]:
    """Every module a file under the package ``root`` imports anywhere, relative imports resolved
    (``from a.b import c`` gives ``a.b``)."""
    package = ".".join(path.relative_to(root.parent).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            found.add(".".join(part for part in (base, node.module or "") if part))
    return found


def breaks(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_what_the_architecture_allows(package: str) -> None:
    folder = PACKAGE_ROOT / package
    if package == "memory" and not folder.exists():
        pytest.skip("specserve/memory does not exist yet")
    files = sorted(folder.rglob("*.py"))
    assert files, f"no modules under specserve/{package}"
    offenders = {
        str(f.relative_to(PACKAGE_ROOT)): sorted(m for m in imported_modules(f) if breaks(m, FORBIDDEN[package]))
        for f in files
    }
    assert not {name: modules for name, modules in offenders.items() if modules}


@pytest.mark.parametrize("package", sorted(ONLY))
def test_package_uses_only_the_allowed_modules_of_a_package(package: str) -> None:
    offenders = {}
    for path in sorted((PACKAGE_ROOT / package).rglob("*.py")):
        for module in imported_modules(path):
            for prefix, allowed in ONLY[package].items():
                if breaks(module, (prefix,)) and not breaks(module, allowed):
                    offenders.setdefault(str(path.relative_to(PACKAGE_ROOT)), []).append(module)
    assert not offenders


def test_nothing_in_the_product_imports_the_lab() -> None:
    # The wheel does not carry lab/: an import of it would work in a checkout and fail for every user.
    offenders = {
        str(f.relative_to(PACKAGE_ROOT)): sorted(m for m in imported_modules(f) if breaks(m, ("lab",)))
        for f in sorted(PACKAGE_ROOT.rglob("*.py"))
    }
    assert not {name: modules for name, modules in offenders.items() if modules}


# The lab's paper campaign runs on the simulator alone, as the simulator does: no framework, none of the runtime.
LAB_FORBIDDEN = {"experiments": (*FRAMEWORKS, *all_ours_but("sim", "speculation", "memory"))}


@pytest.mark.parametrize("folder", sorted(LAB_FORBIDDEN))
def test_the_lab_campaign_imports_only_the_simulator_side(folder: str) -> None:
    files = sorted((LAB_ROOT / folder).rglob("*.py"))
    assert files, f"no modules under lab/{folder}"
    offenders = {
        str(f.relative_to(LAB_ROOT)): sorted(
            m for m in imported_modules(f, LAB_ROOT) if breaks(m, LAB_FORBIDDEN[folder])
        )
        for f in files
    }
    assert not {name: modules for name, modules in offenders.items() if modules}


# The serving runtime's sub-packages, named for the process each runs in (docs/architecture.md). Serve names the
# EngineCore's and the workers' classes only as import strings, since vLLM loads them in processes of its own;
# EngineCore and the workers never reach Ray or the controller; configuration is read everywhere, so reaches nothing.
RUNTIME = "specserve.replicas"
SUBPACKAGES = ("serve", "core", "worker", "draft_memory", "config", "tools")


def runtime(*names: str) -> tuple[str, ...]:
    return tuple(f"{RUNTIME}.{name}" for name in names)


def runtime_but(*allowed: str) -> tuple[str, ...]:
    return runtime(*(p for p in SUBPACKAGES if p not in allowed))


RUNTIME_FORBIDDEN: dict[str, tuple[str, ...]] = {
    "serve": runtime_but("serve", "config"),
    "core": ("ray", "specserve.controller", *runtime_but("core", "draft_memory", "config")),
    "worker": ("ray", "specserve.controller", *runtime_but("worker", "draft_memory", "config")),
    "draft_memory": ("ray", "specserve.controller", *runtime_but("draft_memory", "config")),
    "config": (*FRAMEWORKS, "specserve.controller", *runtime_but("config")),
    "tools": ("ray", "specserve.controller", *runtime_but("tools", "config")),
    # Modules at the runtime's root are shared by EngineCore and the workers.
    "": ("ray", "specserve.controller", *runtime_but("config")),
}


@pytest.mark.parametrize("subpackage", sorted(RUNTIME_FORBIDDEN))
def test_each_runtime_process_imports_only_its_own_side(subpackage: str) -> None:
    folder = PACKAGE_ROOT / "replicas" / subpackage
    files = sorted(folder.rglob("*.py") if subpackage else folder.glob("*.py"))
    assert files, f"no modules under replicas/{subpackage}"
    offenders = {
        str(f.relative_to(PACKAGE_ROOT)): sorted(
            m for m in imported_modules(f) if breaks(m, RUNTIME_FORBIDDEN[subpackage])
        )
        for f in files
    }
    assert not {name: modules for name, modules in offenders.items() if modules}


def test_every_runtime_subpackage_has_a_rule() -> None:
    found = {p.name for p in (PACKAGE_ROOT / "replicas").iterdir() if (p / "__init__.py").exists()}
    assert found == set(SUBPACKAGES) == set(RUNTIME_FORBIDDEN) - {""}


def test_every_package_has_a_rule() -> None:
    packages = {p.name for p in PACKAGE_ROOT.iterdir() if (p / "__init__.py").exists()}
    assert packages <= set(FORBIDDEN), f"packages without an import rule: {sorted(packages - set(FORBIDDEN))}"


def test_the_top_level_modules_import_no_framework() -> None:
    # `import specserve` and the public API (specserve/llm.py) load without Ray, vLLM and torch: the replica class
    # travels as an import path. (test_public_api.py checks the same at run time.)
    offenders = {
        path.name: sorted(m for m in imported_modules(path) if breaks(m, FRAMEWORKS))
        for path in sorted(PACKAGE_ROOT.glob("*.py"))
    }
    assert "llm.py" in offenders
    assert not {name: modules for name, modules in offenders.items() if modules}


def test_the_top_level_modules_import_nothing_of_the_cluster_side() -> None:
    # The public API (llm.py) is what cluster/ builds on, not the other way round: its option sections and their
    # checks live in llm.py, and cluster/sections.py reads them from there. The entry points (``specserve``'s
    # ``build_openai_app``, ``python -m specserve``) hand over to cluster/.
    offenders = {
        path.name: sorted(m for m in imported_modules(path) if breaks(m, ours("cluster")))
        for path in sorted(PACKAGE_ROOT.glob("*.py"))
        if path.name not in ("__init__.py", "__main__.py")
    }
    assert "llm.py" in offenders
    assert not {name: modules for name, modules in offenders.items() if modules}


def test_the_scanner_sees_nested_dotted_and_relative_imports(tmp_path: Path) -> None:
    module = tmp_path / "specserve" / "sim" / "m.py"
    module.parent.mkdir(parents=True)
    module.write_text("import os\nfrom vllm.v1 import x\nfrom ..cluster import y\n\ndef f():\n    import torch.cuda\n")
    assert imported_modules(module, tmp_path / "specserve") == {"os", "vllm.v1", "specserve.cluster", "torch.cuda"}
    assert breaks("vllm.v1", FRAMEWORKS) and not breaks("vllmx", FRAMEWORKS)


def test_importing_the_pure_packages_loads_no_framework() -> None:
    # Transitively too: a pure module must not reach a framework through another module.
    code = (
        "import importlib, pkgutil, sys, specserve.speculation, specserve.sim, specserve.messages; "
        "[importlib.import_module(m.name) for p in (specserve.speculation, specserve.sim) "
        " for m in pkgutil.walk_packages(p.__path__, p.__name__ + '.') if not m.name.endswith('__main__')]; "
        f"print(sorted(m for m in {list(FRAMEWORKS)!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

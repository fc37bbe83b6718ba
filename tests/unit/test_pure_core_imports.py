"""House rule 1: the pure core imports none of ray, vllm, torch or prometheus_client."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

FORBIDDEN = {"ray", "vllm", "torch", "prometheus_client"}
PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "specserve"
PURE_PACKAGES = ("speculation", "sim", "messages")
# Each sub-package of the pure core, named so that a new one gets added here (and a moved one fails loudly).
SPECULATION_PARTS = ("estimators", "policies", "policies/parts", "speckv")


def imported_roots(path: Path) -> set[str]:
    """Top-level module names a file imports anywhere (including inside functions)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", PURE_PACKAGES)
def test_pure_packages_import_no_framework(package: str) -> None:
    files = sorted((PACKAGE_ROOT / package).rglob("*.py"))
    assert files, f"no modules found under specserve/{package}"
    offenders = {str(f.relative_to(PACKAGE_ROOT)): sorted(imported_roots(f) & FORBIDDEN) for f in files}
    assert not {name: roots for name, roots in offenders.items() if roots}


@pytest.mark.parametrize("part", SPECULATION_PARTS)
def test_speculation_subpackages_import_no_framework(part: str) -> None:
    folder = PACKAGE_ROOT / "speculation" / part
    files = sorted(folder.glob("*.py"))
    assert (folder / "__init__.py") in files and len(files) > 1, f"specserve/speculation/{part} is not a package"
    assert not {
        str(f.relative_to(PACKAGE_ROOT)): sorted(imported_roots(f) & FORBIDDEN)
        for f in files
        if imported_roots(f) & FORBIDDEN
    }


def test_scanner_sees_nested_and_dotted_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom vllm.v1 import x\n\ndef f():\n    import torch.cuda\n")
    assert imported_roots(module) == {"os", "vllm", "torch"}


def test_importing_the_pure_packages_loads_no_framework() -> None:
    # Transitively too: a pure module must not reach a framework through another module.
    code = (
        "import importlib, pkgutil, sys, specserve.speculation, specserve.sim, specserve.sim.cli; "
        "[importlib.import_module(m.name) for m in pkgutil.walk_packages("
        "specserve.speculation.__path__, 'specserve.speculation.')]; "
        f"print(sorted(m for m in {sorted(FORBIDDEN)!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

"""The kernel (specserve/sim) never imports the paper campaign (specserve/experiments); both stay framework-free.

The campaign imports the kernel, so a kernel import of the campaign would be a cycle and would drag reports, plots
and the papers' data into every simulator run. The AST scan sees imports anywhere in a module (inside functions
too); the subprocess check sees them transitively.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "specserve"
FRAMEWORKS = {"ray", "vllm", "torch", "prometheus_client"}


def imported_modules(path: Path, root: Path = PACKAGE_ROOT) -> set[str]:
    """Dotted names of every module a file under the package ``root`` imports, relative imports resolved."""
    package = ".".join(path.relative_to(root.parent).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def test_the_kernel_imports_nothing_from_the_campaign() -> None:
    files = sorted((PACKAGE_ROOT / "sim").rglob("*.py"))
    assert files
    offenders = {
        str(f.relative_to(PACKAGE_ROOT)): sorted(
            m for m in imported_modules(f) if m.startswith("specserve.experiments")
        )
        for f in files
    }
    assert not {name: mods for name, mods in offenders.items() if mods}


@pytest.mark.parametrize("package", ["sim", "experiments"])
def test_no_framework_imports(package: str) -> None:
    files = sorted((PACKAGE_ROOT / package).rglob("*.py"))
    offenders = {
        str(f.relative_to(PACKAGE_ROOT)): sorted({m.split(".")[0] for m in imported_modules(f)} & FRAMEWORKS)
        for f in files
    }
    assert not {name: roots for name, roots in offenders.items() if roots}


def test_scanner_resolves_relative_and_nested_imports(tmp_path: Path) -> None:
    path = tmp_path / "specserve" / "sim" / "m.py"
    path.parent.mkdir(parents=True)
    path.write_text(
        "from . import batch\nfrom ..experiments import plots\n\ndef f():\n    import specserve.experiments.cli\n"
    )
    found = imported_modules(path, tmp_path / "specserve")
    assert {"specserve.sim.batch", "specserve.experiments.plots", "specserve.experiments.cli"} <= found


def test_importing_the_kernel_and_its_cli_loads_no_campaign_module() -> None:
    code = (
        "import sys, specserve.sim, specserve.sim.cli, specserve.sim.runner; "
        "print(sorted(m for m in sys.modules if m.startswith('specserve.experiments') or m.split('.')[0] in "
        f"{sorted(FRAMEWORKS)!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

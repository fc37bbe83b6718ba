"""House rule 1 for the simulator: nothing under specserve/sim imports ray, vllm, torch or prometheus_client."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

FORBIDDEN = {"ray", "vllm", "torch", "prometheus_client"}
SIM_ROOT = Path(__file__).resolve().parents[2] / "specserve" / "sim"


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_sim_sources_import_no_framework() -> None:
    files = sorted(SIM_ROOT.rglob("*.py"))
    assert len(files) > 5
    offenders = {str(f.relative_to(SIM_ROOT)): sorted(imported_roots(f) & FORBIDDEN) for f in files}
    assert not {name: roots for name, roots in offenders.items() if roots}


def test_importing_the_simulator_loads_no_framework() -> None:
    # Transitively too: the speculation package it uses must stay pure as well.
    code = (
        "import sys, specserve.sim, specserve.sim.cli; "
        f"print(sorted(m for m in {sorted(FORBIDDEN)!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

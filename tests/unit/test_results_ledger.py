"""The results ledger (bench/results/index.yaml): every committed result file is in it, and each entry is cited by a
page that still cites it or is the raw data of a cited entry. After adding or citing results, regenerate it with
``.venv/bin/python bench/ledger.py``."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"


def load_ledger():
    # bench/ holds scripts, not a package: the generator is loaded from its file.
    spec = importlib.util.spec_from_file_location("bench_ledger", ROOT / "bench" / "ledger.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def index() -> dict[str, dict]:
    return yaml.safe_load((RESULTS / "index.yaml").read_text())["files"]


def committed_results() -> set[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "--", "bench/results"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout
        names = {line[len("bench/results/") :] for line in out.splitlines() if line}
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: the files on disk
        names = {str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*") if p.is_file()}
    return {name for name in names if name != "index.yaml" and (RESULTS / name).exists()}


def test_every_committed_result_file_is_in_the_index_and_nothing_else(index) -> None:
    files = committed_results()
    assert sorted(files - set(index)) == [], "not in the ledger: run bench/ledger.py"
    assert sorted(set(index) - files) == [], "in the ledger but gone: run bench/ledger.py"


def test_every_entry_is_cited_by_a_page_that_still_cites_it_or_is_raw_data_of_one(index) -> None:
    ledger = load_ledger()
    files = sorted(index)
    citing: dict[str, set[str]] = {}
    for page in {page for entry in index.values() for page in entry.get("cited_by", [])}:
        path = ROOT / page
        citing[page] = ledger.cited_names(path.read_text(errors="replace"), files) if path.is_file() else set()
    uncited, dangling = [], []
    for name, entry in index.items():
        if "cited_by" in entry:
            if not any(name in citing[page] for page in entry["cited_by"]):
                uncited.append(name)
            continue
        seen, parent = {name}, entry.get("raw_data_of")
        while parent in index and "cited_by" not in index[parent] and parent not in seen:
            seen.add(parent)
            parent = index[parent].get("raw_data_of")
        if parent not in index or "cited_by" not in index[parent]:
            dangling.append(name)
    assert uncited == [], "no listed page cites these any more: cite them, or git rm them and run bench/ledger.py"
    assert dangling == [], "raw data of nothing cited: cite them, or git rm them and run bench/ledger.py"


def test_the_scanner_reads_paths_globs_and_folders() -> None:
    ledger = load_ledger()
    files = ["a.md", "a.json", "cpu-x-c1.json", "cpu-x-c4.json", "gpu/f-h100.jsonl", "gpu/f-h200.jsonl"]
    text = "see [a](../bench/results/a.md), `bench/results/cpu-x-c*.json` and bench/results/gpu/ (all of it)"
    assert ledger.cited_names(text, files) == {"a.md", "cpu-x-c1.json", "cpu-x-c4.json", *files[4:]}
    assert ledger.cited_names("bench/results/<paper>.md", files) == {"a.md"}
    assert ledger.cited_names("results/a.mdx and results/b.md", files) == set()

"""The results ledger: ``bench/results/index.yaml``, one entry per committed result file, saying which page cites it
(or which cited result it is the raw data of), the machine it ran on where the file records one, the date of its
last commit and the command that made it where the file records one.

    .venv/bin/python bench/ledger.py            # rewrite bench/results/index.yaml
    .venv/bin/python bench/ledger.py --uncited  # list the files nothing cites, one a line (candidates to git rm)

A page is README.md, a page of docs/, a Markdown file of lab/ or bench/README.md. A page cites a result by its path
(``bench/results/x.json``, ``../bench/results/x.json``, ``results/x.json``), by a glob over such paths, or by the
folder it is in. A file nothing cites is raw data of a cited result when that result's page names it (a cited
``x.md`` linking ``x-tok_s.png``), when the two share a prefix in the same folder (``x.json``, ``x.png`` beside a
cited ``x.md``) or when it sits in a cited result's folder. tests/unit/test_results_ledger.py checks the index
against the tree and the pages.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
INDEX = RESULTS / "index.yaml"
# A path to a result as pages write it; the part after "results/" is the key.
CITATION = re.compile(r"(?:bench/)?results/([\w.*?<>/-]+)")
# What a command line starts with, in a page's first code span or block.
COMMAND_START = re.compile(
    r"^(?:\$ )?(?:[A-Z_]+=\S+ )*(?:\.venv/bin/)?(?:python3? |specserve |make |vllm |bench/|lab/)"
)
MACHINE = re.compile(
    r"(AMD EPYC(?: with [\w-]+(?: and [\w-]+)?)?|Intel\(R\) Xeon\(R\)[\w ().@-]*?(?= CPU|[\"\n,;|]|$)|"
    r"Xeon with AMX(?: \(\d cores\))?|"
    r"NVIDIA (?:H100|H200|A100|L40S|L4)[\w -]*)"
)
# The CPU's instruction set or the GPU, where only the file's name records it (engine-check-avx2-parts/...).
MACHINE_IN_NAME = re.compile(r"(?<![a-z0-9])(amx|avx512bf16|avx512|avx2|xeon|h100|h200)(?![a-z0-9])")


def result_files() -> list[str]:
    """Every committed result file, as a path under bench/results (the index itself left out)."""
    out = subprocess.run(
        ["git", "ls-files", "--", "bench/results"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    files = [line[len("bench/results/") :] for line in out.splitlines() if line]
    return sorted(f for f in files if f != INDEX.name and (RESULTS / f).exists())


def pages() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "bench" / "README.md"]
    found += sorted((ROOT / "docs").rglob("*.md")) + sorted((ROOT / "lab").rglob("*.md"))
    return [p for p in found if p.is_file()]


def cited_names(text: str, files: list[str]) -> set[str]:
    """The result files a text names: paths, globs over them and folders (everything under a folder)."""
    named: set[str] = set()
    for match in CITATION.finditer(text):
        ref = match.group(1).rstrip(".,:;)`'\"")
        if not ref:
            continue
        if any(ch in ref for ch in "*?<"):
            named.update(f for f in files if glob_pattern(ref).fullmatch(f))
        elif ref in files:
            named.add(ref)
        else:
            folder = ref.rstrip("/") + "/"
            named.update(f for f in files if f.startswith(folder))
    return named


def glob_pattern(ref: str) -> re.Pattern[str]:
    """A cited glob as a regex: ``*`` and ``?`` within one path segment, as the shell expands them, and a
    placeholder (``<paper>.md``, ``transfer-<gpu>.jsonl``) as one word."""
    parts = []
    for token in re.split(r"(<[^>]*>|\*|\?)", ref):
        if token == "*":
            parts.append(r"[^/]*")
        elif token == "?":
            parts.append(r"[^/]")
        elif token.startswith("<") and token.endswith(">"):
            parts.append(r"[A-Za-z0-9_]+")
        else:
            parts.append(re.escape(token))
    return re.compile("".join(parts))


def build() -> dict[str, dict]:
    files = result_files()
    cited_by: dict[str, list[str]] = {f: [] for f in files}
    for page in pages():
        for name in cited_names(page.read_text(errors="replace"), files):
            cited_by[name].append(str(page.relative_to(ROOT)))
    owner = raw_data_owners(files, {f for f in files if cited_by[f]})
    dates = last_commit_dates()
    index: dict[str, dict] = {}
    for f in files:
        entry: dict[str, object] = {}
        if cited_by[f]:
            entry["cited_by"] = sorted(set(cited_by[f]))
        elif f in owner:
            entry["raw_data_of"] = owner[f]
        entry["machine"] = machine_of(RESULTS / f)
        entry["date"] = dates.get(f)
        entry["command"] = command_of(RESULTS / f)
        index[f] = entry
    return index


def raw_data_owners(files: list[str], cited: set[str]) -> dict[str, str]:
    """Uncited file -> the cited (or itself raw) result whose raw data it is. In order: a result page names it; it
    shares its run's name with a cited result in the same folder (``x.json`` beside ``x.md``), or extends the name of
    a cited run's page (``x-tok_s.png`` beside ``x.md``) and has no page of its own; it sits in a sub-folder with a
    cited result."""
    owner: dict[str, str] = {}

    def belongs(f: str) -> bool:
        return f in cited or f in owner

    changed = True
    while changed:
        changed = False
        for parent in [f for f in files if belongs(f) and f.endswith((".md", ".txt"))]:
            text = (RESULTS / parent).read_text(errors="replace")
            folder = parent.rpartition("/")[0]
            named = cited_names(text, files)
            for f in files:
                if belongs(f) or f.rpartition("/")[0] != folder and f not in named:
                    continue
                name = f.rpartition("/")[2]
                if f in named or re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text):
                    owner[f] = parent
                    changed = True
    pages_by_run = {(f.rpartition("/")[0], stem(f)) for f in files if f.endswith(".md")}
    for f in files:
        if belongs(f):
            continue
        folder = f.rpartition("/")[0]
        siblings = [c for c in files if belongs(c) and c.rpartition("/")[0] == folder]
        same = [c for c in siblings if stem(c) == stem(f)]
        # The run it extends is the longest page name it starts with, cited or not: x-2-tok_s.png is x-2.md's.
        runs = [s for d, s in pages_by_run if d == folder and re.match(rf"{re.escape(s)}[-_]", stem(f))]
        run = max(runs, key=len, default=None)
        extended = [c for c in siblings if stem(c) == run]
        if same:
            owner[f] = min(same, key=lambda c: (not c.endswith(".md"), c))
        elif extended and (folder, stem(f)) not in pages_by_run:
            owner[f] = min(extended, key=lambda c: (not c.endswith(".md"), c))
        elif folder and siblings:
            owner[f] = min(siblings)
    return owner


def stem(name: str) -> str:
    """``x`` for ``x.json``, ``x.md``, ``x.serve.log``: the run's name, which its files share."""
    return name.rpartition("/")[2].split(".")[0]


def last_commit_dates() -> dict[str, str]:
    out = subprocess.run(
        ["git", "log", "--format=@%ad", "--date=short", "--name-only", "--", "bench/results"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    dates: dict[str, str] = {}
    current = ""
    for line in out.splitlines():
        if line.startswith("@"):
            current = line[1:]
        elif line.startswith("bench/results/"):
            dates.setdefault(line[len("bench/results/") :], current)
    return dates


def machine_of(path: Path) -> str | None:
    text = path.read_text(errors="replace")[:200_000] if path.suffix != ".png" else ""
    if path.suffix == ".json":
        try:
            document = json.loads(text)
        except ValueError:
            document = None
        if isinstance(document, dict):
            for key in ("machine", "cpu", "cpu_model", "gpu", "device", "host"):
                if isinstance(document.get(key), str):
                    return document[key]
    found = MACHINE.search(text)
    if found:
        return found.group(1).strip()
    named = MACHINE_IN_NAME.search(str(path.relative_to(RESULTS)).lower())
    return f"{named.group(1)} (from the file name)" if named else None


def command_of(path: Path) -> str | None:
    if path.suffix == ".json":
        try:
            document = json.loads(path.read_text(errors="replace"))
        except ValueError:
            return None
        if isinstance(document, dict):
            command = document.get("command") or (document.get("settings") or {}).get("command")
            return command.strip() if isinstance(command, str) else None
        return None
    if path.suffix not in (".md", ".txt"):
        return None
    in_block = False
    for line in path.read_text(errors="replace").splitlines():
        if line.strip().startswith("```"):
            in_block = not in_block
            continue
        if path.suffix == ".txt" or in_block:
            spans = [line.strip()]
        elif line.lstrip().startswith("#"):  # a title names commands, it does not give one
            continue
        else:
            spans = re.findall(r"`([^`]+)`", line)
        for span in (s.strip() for s in spans):
            # A command line, not a command's name in a sentence: it passes an argument or runs a script.
            if COMMAND_START.match(span) and (in_block or path.suffix == ".txt" or re.search(r" -|\.py\b", span)):
                return span.rstrip("\\").strip()
    return None


def render(index: dict[str, dict]) -> str:
    head = (
        "# The results ledger: every committed file under bench/results, the page that cites it (or the cited\n"
        "# result it is the raw data of), the machine and command where the file records them, and the date of its\n"
        "# last commit. Generated by bench/ledger.py; checked by tests/unit/test_results_ledger.py.\n"
    )
    return head + yaml.safe_dump({"files": index}, sort_keys=True, allow_unicode=True, width=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uncited", action="store_true", help="list the files nothing cites instead of writing")
    args = parser.parse_args()
    index = build()
    if args.uncited:
        for name, entry in index.items():
            if "cited_by" not in entry and "raw_data_of" not in entry:
                print(f"bench/results/{name}")
        return 0
    INDEX.write_text(render(index))
    print(f"wrote {INDEX.relative_to(ROOT)}: {len(index)} files", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The CLI's front: `specserve --version` prints the installed version, and `specserve --help` says where the files
the wheel does not carry (deploy/, dashboards/) and the docs are."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

from specserve.cluster import cli

REPO = Path(__file__).resolve().parents[2]


def test_version_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    expected = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out == f"specserve {expected}\n"


def test_help_points_at_the_docs_and_at_the_folders_the_wheel_leaves_out(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    site = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert (cli.DOCS_URL, cli.REPO_URL) == (site["site_url"], site["repo_url"])
    for folder in ("deploy", "dashboards"):
        assert f"{cli.REPO_URL}/tree/main/{folder}" in out
        assert (REPO / folder).is_dir()
    assert cli.DOCS_URL in out

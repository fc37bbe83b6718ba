"""README.md is the PyPI page, so its links are absolute: the ones into the docs site name pages the site has, the
ones into the repository name files it has, and the addresses agree with mkdocs.yml and pyproject.toml."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _site() -> dict:
    # mkdocs.yml has no custom YAML tags, so a plain safe_load reads it.
    return yaml.safe_load((REPO / "mkdocs.yml").read_text())


def test_readme_links_to_the_docs_site_name_pages_that_exist():
    site_url = _site()["site_url"]
    readme = (REPO / "README.md").read_text()
    links = re.findall(re.escape(site_url) + r"([^)#\s]*)", readme)
    assert links, "README links to no docs page"
    for link in links:
        path = link.rstrip("/")
        assert path == "" or (REPO / "docs" / f"{path}.md").exists() or (REPO / "docs" / path / "index.md").exists(), (
            link
        )


def test_readme_has_no_relative_links():
    readme = (REPO / "README.md").read_text()
    relative = [t for t in re.findall(r"\]\(([^)\s]+)\)", readme) if "://" not in t and not t.startswith("#")]
    assert not relative, f"PyPI cannot follow relative links: {relative}"


def test_project_urls_point_at_the_site_and_repository():
    urls = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]
    assert urls["Documentation"] == _site()["site_url"]
    assert urls["Repository"] == _site()["repo_url"]


def test_readme_links_into_the_repository_name_files_it_has():
    repo_url = _site()["repo_url"]
    readme = (REPO / "README.md").read_text()
    paths = re.findall(re.escape(repo_url) + r"/(?:blob|tree)/main/([^)#\s]+)", readme)
    assert paths
    for path in paths:
        assert (REPO / path).exists(), path

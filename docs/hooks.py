"""mkdocs hook: links from a page to files of the repository outside docs/ (result files, deploy/, examples/).

On GitHub such a relative link (``../bench/results/x.md``) works as written; the built site has no copy of the
file, so the hook points the link at the file in the repository (``repo_url``) and fails the strict build when
the file does not exist, which keeps the citations honest the way mkdocs checks links between pages.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.plugins.specserve")
_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    repo = docs_dir.parent
    base = config["repo_url"].rstrip("/")
    page_dir = posixpath.dirname(page.file.src_uri)

    def rewrite(match: re.Match[str]) -> str:
        bang, text, target = match.groups()
        if "://" in target or target.startswith(("#", "mailto:")):
            return match.group(0)
        path, _, anchor = target.partition("#")
        resolved = posixpath.normpath(posixpath.join("docs", page_dir, path))
        if not resolved.startswith("../") and not resolved.startswith("docs/"):
            if not (repo / resolved).exists():
                log.warning("%s links to %s, which is not in the repository", page.file.src_uri, resolved)
                return match.group(0)
            kind = "raw" if bang else "blob"
            url = f"{base}/{kind}/main/{resolved}" + (f"#{anchor}" if anchor else "")
            return f"{bang}[{text}]({url})"
        return match.group(0)

    return _LINK.sub(rewrite, markdown)

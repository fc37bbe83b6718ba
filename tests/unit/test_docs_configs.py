"""Every config file the docs show (a YAML block with a `speculation` section) loads as written and renders into the
Serve application with its `engine_kwargs` untouched, as a GPU user would copy it into `specserve config render`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from specserve.cluster.app import resolve_serve, serve_document
from specserve.cluster.config import load_config

DOCS = Path(__file__).resolve().parents[2] / "docs"
BLOCK = re.compile(r"```ya?ml\n(.*?)```", re.S)


def config_blocks() -> list[tuple[str, str]]:
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        for match in BLOCK.finditer(text):
            if "speculation:" in match.group(1):
                line = text[: match.start()].count("\n") + 1
                found.append((f"{page.relative_to(DOCS)}:{line}", match.group(1)))
    return found


BLOCKS = config_blocks()


def test_the_docs_show_config_files() -> None:
    pages = {where.split(":")[0] for where, _ in BLOCKS}
    assert {"gpu-cluster.md", "configuration.md"} <= pages


@pytest.mark.parametrize(("where", "block"), BLOCKS, ids=[where for where, _ in BLOCKS])
def test_a_docs_config_renders_with_its_engine_arguments_in_place(where: str, block: str, tmp_path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(block)
    written = yaml.safe_load(block)
    config = load_config(str(path), {"accelerator_config.kind": "gpu"})
    (llm,) = serve_document(resolve_serve(config))["applications"][0]["args"]["llm_configs"]
    for key, value in written.get("engine_kwargs", {}).items():
        assert llm["engine_kwargs"][key] == value, (where, key)
    speculation = written["speculation"]
    if "max_k" in speculation:
        assert llm["engine_kwargs"]["speculative_config"]["num_speculative_tokens"] == speculation["max_k"], where
    if "model_loading_config" in written:
        assert llm["model_loading_config"]["model_id"] == written["model_loading_config"]["model_id"], where

"""docs/configuration.md's key tables, generated from the config models' own descriptions (one truth: a test fails
when the page and the code differ). ``python -m specserve.cluster.config_reference`` rewrites the page's tables."""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel

from specserve.cluster.config import LEGACY_KEYS, ServeConfig
from specserve.cluster.sections import CpuEngine, ServerOptions, Speculation

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
BEGIN, END = "<!-- generated: keys -->", "<!-- end generated -->"
_SECTIONS: tuple[tuple[str, type[BaseModel]], ...] = (
    ("speculation", Speculation),
    ("cpu", CpuEngine),
    ("server", ServerOptions),
)


def _default(model: type[BaseModel], name: str) -> str:
    field = model.model_fields[name]
    if field.default_factory is not None or isinstance(field.default, BaseModel):
        return "-"
    value = field.default
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{list(value)}`" if isinstance(value, tuple) else f"`{value}`"


def _rows(model: type[BaseModel], prefix: str = "") -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        if name in dict(_SECTIONS):
            continue
        text = (field.description or "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| `{prefix}{name}` | {_default(model, name)} | {text} |")
    return rows


def tables() -> str:
    """The generated part of the page: the LLMConfig keys, each section's, and the old flat keys."""
    out = ["### Ray Serve LLM's keys", "", "| key | default | what it is |", "|---|---|---|", *_rows(ServeConfig)]
    for section, model in _SECTIONS:
        out += ["", f"### `{section}:`", "", "| key | default | what it is |", "|---|---|---|"]
        out += _rows(model, f"{section}.")
    out += ["", "### Keys of earlier releases", "", "| old key | now |", "|---|---|"]
    out += [f"| `{old}` | `{new}` |" for old, new in sorted(LEGACY_KEYS.items())]
    return "\n".join(out)


def render(page: str) -> str:
    head, _, rest = page.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{tables()}\n{END}{tail}"


if __name__ == "__main__":
    PAGE.write_text(render(PAGE.read_text()))
    sys.exit(0)

"""How a benchmark command hands over its result: one JSON document on stdout, and the same in a file if asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def emit_report(report: dict[str, Any], out: str | Path | None) -> None:
    """Print ``report`` as indented JSON; also write it to ``out`` unless that is None or empty."""
    text = json.dumps(report, indent=2)
    print(text)
    if out:
        Path(out).write_text(text + "\n")

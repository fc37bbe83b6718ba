"""Short Python openings the bundled pairs continue well: the one prompt list of the engine benchmarks and the
engine tests, so that their runs decode the same text."""

from __future__ import annotations

OPENINGS: tuple[str, ...] = (
    "def fibonacci(n):\n    ",
    "import os\nimport sys\n\n",
    "class Parser:\n    def __init__(self",
    "for line in open(path):\n",
    "def main():\n    args = ",
    "with open(filename) as f:\n",
    "import json\n\ndef load(",
    "while True:\n    line = ",
)

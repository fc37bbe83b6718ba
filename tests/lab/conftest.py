"""The lab's tests reuse the product tiers' helpers (synthetic step records, titled processes, small scenarios):
pytest puts only a test's own folder on the path, so the helpers' folders go there too."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
for helpers in (TESTS / "unit", TESTS / "sim"):
    if str(helpers) not in sys.path:
        sys.path.insert(0, str(helpers))

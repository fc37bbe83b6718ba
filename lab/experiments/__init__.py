"""The paper campaign on top of the simulator kernel (``specserve.sim``): reproduce each paper's comparisons, the
leaderboard that sets one policy against the whole zoo, and the latency model checked against the papers' step
times, with their reports and plots. The papers' numbers are data with citations under ``papers/``.

This package imports the kernel; the kernel never imports it (tests/unit/test_import_rules.py). Its commands join
the kernel's under ``python -m lab`` (``lab.experiments.cli``).
"""

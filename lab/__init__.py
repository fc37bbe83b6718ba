"""The lab: specserve's research tools, kept out of the installed package.

- ``experiments``: the paper campaign on the simulator (reproductions, the leaderboard, the latency check, the
  GPU fit, the engine check's simulator half) with the papers' numbers as cited data (``experiments/papers``).
- ``harness``: drives a real engine with a trace or a closed loop (the engine half of the engine check).
- ``instruments``: the CPU tally of a served load and the noise model of ``bench compare`` readings.
- ``speckv``: SpecKV's samples, synthetic data and training (the ``mlp`` policy keeps the model and its weights).
- ``studies``: one script per question, each answered once; their results are under ``bench/results``.

Run from the repository root: ``python -m lab ...`` (the simulator's commands and the campaign's); the studies run
as ``PYTHONPATH=$PWD python lab/studies/QUESTION/SCRIPT.py``. It imports the product (``specserve``); nothing in
the product imports it (tests/unit/test_import_rules.py). Its plots and progress bars need the ``lab`` extra.
"""

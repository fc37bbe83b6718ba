"""``python -m lab ...``: the simulator's commands with the paper campaign's (reproduce, leaderboard, latency-check,
gpu-fit) and SpecKV training's (mlp-samples, train-mlp), from the repository root."""

import argparse
import sys

from lab.experiments.cli import add_commands, run
from lab.speckv.cli import add_commands as add_speckv_commands

parser = argparse.ArgumentParser(
    prog="python -m lab", description="The simulator, the paper campaign and SpecKV training (specserve's lab)."
)
add_speckv_commands(add_commands(parser, dest="sim_command"))
sys.exit(run(parser.parse_args()))

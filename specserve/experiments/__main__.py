"""``python -m specserve.experiments ...``: every ``specserve sim`` command (the kernel's and the campaign's) without
the main command line."""

import argparse
import sys

from specserve.experiments.cli import add_commands, run

parser = argparse.ArgumentParser(
    prog="python -m specserve.experiments", description="Discrete-event serving simulator and the paper campaign."
)
add_commands(parser, dest="sim_command")
sys.exit(run(parser.parse_args()))

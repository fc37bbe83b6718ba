"""``python -m specserve.sim scenarios|compare ...``: the simulator's commands without the main CLI."""

import argparse
import sys

from specserve.sim.cli import add_commands, run

parser = argparse.ArgumentParser(prog="python -m specserve.sim", description="Discrete-event serving simulator.")
add_commands(parser, dest="sim_command")
sys.exit(run(parser.parse_args()))

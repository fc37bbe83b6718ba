"""``python -m specserve.sim scenarios|compare ...``: the kernel's commands without the main command line. The paper
campaign's (reproduce, leaderboard, latency-check, gpu-fit) and SpecKV training's are the lab's: ``python -m lab``."""

import argparse
import sys

from specserve.sim.cli import add_commands, run

parser = argparse.ArgumentParser(prog="python -m specserve.sim", description="Discrete-event serving simulator.")
add_commands(parser, dest="sim_command")
sys.exit(run(parser.parse_args()))

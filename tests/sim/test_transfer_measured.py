"""The simulator's host-link model against copies measured on GPUs (bench/results/gpu, bench/gpu_transfer.py).

n pinned copies of a draft's bytes started together on one GPU; the model (``TransferLink``, processor sharing
at the hardware profile's ``host_to_device_gb_s``) says the last ends after n times one copy's time."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from specserve.sim.profiles import hardware_profiles
from specserve.sim.transfers import TransferLink

MEASURED = sorted((Path(__file__).parents[2] / "bench" / "results" / "gpu").glob("transfer-*.jsonl"))


def last_done_s(link: TransferLink, copies: int, num_bytes: float) -> float:
    for owner in range(copies):
        link.add(0.0, owner, num_bytes)
    end = 0.0
    while len(link):
        end = link.next_done_s() or end
        link.pop_done(end)
    return end


@pytest.mark.parametrize("path", MEASURED, ids=lambda p: p.stem)
def test_n_copies_at_once_share_the_link_as_the_simulator_prices_them(path):
    gpu = path.stem.removeprefix("transfer-")
    rate = hardware_profiles()[gpu].host_to_device_gb_s * 1e9
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    copies = [r for r in rows if r["kind"] == "copy" and r["host_memory"] == "pinned"]
    assert {r["concurrency"] for r in copies} >= {1, 2, 4, 8}
    ratios = [r["median_s"] / last_done_s(TransferLink(rate), r["concurrency"], r["size_gb"] * 1e9) for r in copies]
    # The profile's rate is the link's: a typical copy takes the modelled time, and none beats it.
    assert abs(statistics.median(ratios) - 1) < 0.02
    assert min(ratios) > 0.95

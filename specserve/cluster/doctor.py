"""`specserve doctor`: the start-up checks and the step-cost table on this machine's hardware, for a config.

The first command to run on a new GPU node: it builds the engine a replica of the config would run (the same engine
arguments, environment and engine path), in this process, with no Ray cluster, runs the calibration every replica
runs before it serves (``replicas/serve/calibration.py``), and prints one table of checks and one of step costs. Exit
status 1 when a check fails.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile

from specserve.cluster.app import llm_config_fields, resolve_serve
from specserve.cluster.config import ConfigError, ServeConfig, require_folders_here
from specserve.replicas.serve.calibration import Calibration
from specserve.speculation.startup_checks import cost_table


def run_doctor(config: ServeConfig) -> Calibration:
    """The calibration on an engine built from ``config`` (the bundled tiny pair without a model)."""
    from specserve.replicas.config import engine_env
    from specserve.replicas.serve.calibration import OfflineEngine, calibrate_engine
    from specserve.replicas.tools.offline import offline_llm

    require_folders_here(config, "doctor loads it")
    scratch = tempfile.mkdtemp(prefix="specserve-doctor-")
    try:
        resolved = resolve_serve(config, scratch)
        fields = llm_config_fields(resolved)
        source = fields["model_loading_config"]["model_source"]
        if isinstance(source, dict):
            raise ConfigError(
                "doctor loads the target with vLLM on this machine: give it a Hugging Face id or a folder, not "
                f"object storage ({source.get('bucket_uri')})"
            )
        engine_kwargs = dict(fields["engine_kwargs"])
        env = fields["runtime_env"].get("env_vars", {})
        with engine_env.applied(env), offline_llm(model=source, **engine_kwargs) as llm:
            max_num_seqs = llm.llm_engine.vllm_config.scheduler_config.max_num_seqs
            return asyncio.run(calibrate_engine(OfflineEngine(llm), engine_kwargs, max_num_seqs))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def report(calibration: Calibration) -> list[str]:
    """The checks (check, expected, seen, ok), then the step costs (k, batch, median decode step in ms)."""
    rows: list[tuple[str, ...]] = [("CHECK", "EXPECTED", "SEEN", "OK")]
    rows += [(c.name, c.expected, c.seen, "ok" if c.ok else "FAILED") for c in calibration.checks]
    lines = _table(rows)
    lines.append("")
    costs: list[tuple[str, ...]] = [("K", "BATCH", "DECODE STEP MS")]
    costs += [(str(k), str(b), "-" if s is None else f"{s * 1000:.2f}") for k, b, s in cost_table(calibration.results)]
    lines += _table(costs)
    return lines


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def main(config: ServeConfig) -> int:
    calibration = run_doctor(config)
    for line in report(calibration):
        print(line)
    print(
        f"doctor: {len(calibration.results)} runs in {calibration.seconds:.1f} s; "
        + ("every check passed" if not calibration.failed else f"failed: {', '.join(calibration.failed)}"),
        file=sys.stderr,
    )
    return 1 if calibration.failed else 0

"""`specserve doctor`: the start-up checks and the step-cost table on this machine's hardware, for a config.

The first command to run on a new GPU node: it builds the engine a replica of the config would run (the same engine
arguments, environment and engine path), in this process, with no Ray cluster, runs the calibration every replica
runs before it serves (``replicas/serve/calibration.py``), and prints one table of checks and one of step costs. Exit
status 1 when a check fails. With ``--prompts FILE`` it then decodes your prompts at the engine's max k and prints
what speculation would pay on them: the acceptance per draft position, and per (k, batch) of the cost table the
tokens a request emits a step and the speed-up over k = 0 (TurboSpec's goodput, Eq. 4, from the measured steps).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from specserve.cluster.app import llm_config_fields, resolve_serve
from specserve.cluster.config import ConfigError, ServeConfig, require_folders_here
from specserve.replicas.serve.calibration import Calibration
from specserve.speculation.startup_checks import cost_table, payoff_table

#: Output tokens per prompt of ``--prompts`` (``--max-tokens``): enough steps at max k to count each position.
PROMPT_MAX_TOKENS = 64


def load_prompts(path: Path) -> list[str]:
    """The prompts of a ``--prompts`` file: one a line, or JSON lines with a ``prompt`` (for prompts with newlines);
    blank lines are skipped. Raises ConfigError naming the file, and the line where one is bad."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--prompts {path}: cannot read it ({exc.__class__.__name__}: {exc})") from None
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                prompt = json.loads(line).get("prompt")
            except (json.JSONDecodeError, AttributeError):
                prompt = None
            if not isinstance(prompt, str) or not prompt:
                raise ConfigError(f'--prompts {path}: line {number}: a JSON line needs a "prompt" string')
            line = prompt
        prompts.append(line)
    if not prompts:
        raise ConfigError(f'--prompts {path}: no prompts (one a line, or JSON lines with a "prompt")')
    return prompts


def run_doctor(
    config: ServeConfig, prompts: list[str] | None = None, max_tokens: int = PROMPT_MAX_TOKENS
) -> tuple[Calibration, dict[str, Any] | None]:
    """The calibration on an engine built from ``config`` (the bundled tiny pair without a model), and with
    ``prompts`` the acceptance on them at the engine's max k (``offline.acceptance_on``)."""
    from specserve.replicas.config import engine_env
    from specserve.replicas.serve.calibration import OfflineEngine, calibrate_engine
    from specserve.replicas.tools.offline import acceptance_on, offline_llm

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
            calibration = asyncio.run(calibrate_engine(OfflineEngine(llm), engine_kwargs, max_num_seqs))
            if not prompts:
                return calibration, None
            max_k = engine_kwargs["speculative_config"]["num_speculative_tokens"]
            acceptance = acceptance_on(llm, prompts, max_k, max_tokens)
            return calibration, {"num_prompts": len(prompts), "k": max_k, **acceptance}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def report(calibration: Calibration, acceptance: dict[str, Any] | None = None) -> list[str]:
    """The checks (check, expected, seen, ok), then the step costs (k, batch, median decode step in ms); with
    ``acceptance`` (``run_doctor``'s), the acceptance per position on the prompts and what each (k, batch) pays."""
    rows: list[tuple[str, ...]] = [("CHECK", "EXPECTED", "SEEN", "OK")]
    rows += [(c.name, c.expected, c.seen, "ok" if c.ok else "FAILED") for c in calibration.checks]
    lines = _table(rows)
    lines.append("")
    costs = cost_table(calibration.results)
    timed: list[tuple[str, ...]] = [("K", "BATCH", "DECODE STEP MS")]
    timed += [(str(k), str(b), "-" if s is None else f"{s * 1000:.2f}") for k, b, s in costs]
    lines += _table(timed)
    if acceptance is None:
        return lines
    alphas = acceptance_per_position(acceptance)
    lines += [
        "",
        f"acceptance per draft position on {acceptance['num_prompts']} prompts at k = {acceptance['k']} (of the drafts "
        "that reached it): " + " ".join("-" if a is None else f"{a:.3f}" for a in alphas),
        "",
    ]
    known = [a for a in alphas if a is not None]
    if not known:
        return [*lines, "no draft reached position 0: nothing to price"]
    # A position no draft reached takes the rate of the one before it, as the policy's estimate does.
    filled, last = [], known[0]
    for a in alphas:
        last = last if a is None else a
        filled.append(last)
    payoff = payoff_table(costs, filled)
    pays: list[tuple[str, ...]] = [("K", "BATCH", "TOKENS/STEP", "SPEED-UP")]
    pays += [
        (str(k), str(b), f"{tokens:.2f}", "-" if speedup is None else f"{speedup:.2f}")
        for k, b, tokens, speedup in payoff
    ]
    return [*lines, *_table(pays), "", best_k_line(payoff)]


def best_k_line(payoff: list[tuple[int, int, float, float | None]]) -> str:
    """Per batch, the k that pays most (the smallest where several tie), or that none does."""
    best: dict[int, tuple[float, int]] = {}
    for k, batch, _, speedup in payoff:
        if speedup is not None and (batch not in best or speedup > best[batch][0]):
            best[batch] = (speedup, k)
    parts = [
        f"batch {batch}: k = {k} ({speedup:.2f} x)" if k else f"batch {batch}: k = 0 (speculation does not pay)"
        for batch, (speedup, k) in sorted(best.items())
    ]
    return "best k: " + ", ".join(parts)


def acceptance_per_position(acceptance: dict[str, Any]) -> list[float | None]:
    """Accepted over reached per draft position; None where no draft reached it."""
    return [
        a / r if r else None
        for a, r in zip(acceptance["num_accepted_per_pos"], acceptance["num_reached_per_pos"], strict=True)
    ]


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def main(config: ServeConfig, prompts: Path | None = None, max_tokens: int = PROMPT_MAX_TOKENS) -> int:
    texts = load_prompts(prompts) if prompts is not None else None
    calibration, acceptance = run_doctor(config, texts, max_tokens)
    for line in report(calibration, acceptance):
        print(line)
    print(
        f"doctor: {len(calibration.results)} runs in {calibration.seconds:.1f} s; "
        + ("every check passed" if not calibration.failed else f"failed: {', '.join(calibration.failed)}"),
        file=sys.stderr,
    )
    return 1 if calibration.failed else 0

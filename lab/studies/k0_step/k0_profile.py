"""Where a k = 0 step's time goes: cProfile of greedy decoding on an engine built in this process.

    PYTHONPATH=$PWD .venv/bin/python lab/studies/k0_step/k0_profile.py \
        [--engine skip|no_spec] [--batch 8] [--tokens 200]
        [--pair trained | --pair perf --size S --agreement 0.6] [--against-plain] [--out FILE]

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so the profiler sees the scheduler, the
runner and specserve's hooks together. After a warm-up generation, one generation of ``--batch`` prompts x
``--tokens`` tokens at k = 0 is profiled. Printed: the steps' profiled time, the self time of specserve's own
functions per step (the cost `lab/studies/k0_step/k0_step.py` cannot separate from noise), and the largest of them. The
profiler inflates Python-heavy code two to three times, so read the shares, not the absolute times.

``--against-plain`` then profiles an engine without speculation the same way and adds what the speculative
engine ran beyond it, per step: the self time of functions the plain engine never called (specserve's and
vLLM's speculative path alike) and the share of the calls it made more often than the plain engine did.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile
from pathlib import Path
from typing import Any

from k0_step import PROMPTS, engine_kwargs, generation_s

from lab.experiments.report_io import emit_report
from specserve.models.arguments import add_perf_options

OURS = os.sep + "specserve" + os.sep


def summarise(stats: pstats.Stats, steps: int, top: int) -> dict[str, Any]:
    # (file, line, function) -> (primitive calls, calls, self seconds, cumulative seconds, callers)
    entries = stats.stats  # type: ignore[attr-defined]
    ours = [(tt, f"{Path(f).name}:{line}({fn})") for (f, line, fn), (_, _, tt, _, _) in entries.items() if OURS in f]
    steps_s = [ct for (f, _, fn), (_, _, _, ct, _) in entries.items() if f.endswith("engine/core.py") and fn == "step"]
    step_s = max(steps_s)
    return {
        "steps": steps,
        "profiled_ms_per_step": round(step_s / steps * 1e3, 3),
        "specserve_self_us_per_step": round(sum(tt for tt, _ in ours) / steps * 1e6, 1),
        "largest_us_per_step": {name: round(tt / steps * 1e6, 1) for tt, name in sorted(ours, reverse=True)[:top]},
    }


def _key(file: str, line: int, function: str) -> str:
    return f"{'/'.join(Path(file).parts[-3:])}:{line}({function})"


def beyond(spec: pstats.Stats, plain: pstats.Stats, steps: int, top: int) -> dict[str, Any]:
    """What the speculative engine's profile has beyond the plain one's, in microseconds per step."""
    theirs = {_key(*k): (nc, tt) for k, (_, nc, tt, _, _) in plain.stats.items()}  # type: ignore[attr-defined]
    extra: dict[str, float] = {}
    for k, (_, calls, self_s, _, _) in spec.stats.items():  # type: ignore[attr-defined]
        name = _key(*k)
        plain_calls = theirs.get(name, (0, 0.0))[0]
        if calls > plain_calls:
            extra[name] = self_s * (1 - plain_calls / calls)
    return {
        "extra_us_per_step": round(sum(extra.values()) / steps * 1e6, 1),
        "largest_us_per_step": {
            name: round(s / steps * 1e6, 1) for name, s in sorted(extra.items(), key=lambda kv: -kv[1])[:top]
        },
    }


def profile_engine(name: str, target: str, draft: str, batch: int, tokens: int) -> tuple[float, pstats.Stats]:
    """Seconds of one unprofiled generation after a warm-up, and the profile of the next."""
    from specserve.replicas.tools import offline

    with offline.offline_llm(**engine_kwargs(name, target, draft)) as llm:
        generation_s(llm, batch, tokens)  # warm-up
        plain_s = generation_s(llm, batch, tokens)
        profile = cProfile.Profile()
        profile.runcall(generation_s, llm, batch, tokens)
    return plain_s, pstats.Stats(profile)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=("skip", "no_skip", "no_spec"), default="skip")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--pair", choices=("trained", "perf"), default="trained")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--against-plain", action="store_true", help="also profile no_spec; report the difference")
    add_perf_options(parser, size="S", agreement=0.6)
    args = parser.parse_args()
    if not 1 <= args.batch <= len(PROMPTS):
        parser.error(f"--batch {args.batch}: must be 1..{len(PROMPTS)}")
    if args.tokens < 2:
        parser.error(f"--tokens {args.tokens}: must be at least 2")

    if args.against_plain and args.engine == "no_spec":
        parser.error("--against-plain compares a speculative --engine (skip or no_skip) with no_spec")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from specserve.models import cached_pair
    from specserve.replicas.config import engine_env

    options = {"size": args.size, "agreement": args.agreement} if args.pair == "perf" else {}
    pair = cached_pair(args.pair, **options)
    target, draft = str(pair.target), str(pair.draft)
    with engine_env.applied(engine_env.engine_env(tempfile.mkdtemp(prefix="specserve-k0-profile-"))):
        plain_s, stats = profile_engine(args.engine, target, draft, args.batch, args.tokens)
        report: dict[str, Any] = {
            "what": f"k=0 decode, {args.engine} engine, in process, cProfile",
            "pair": {"kind": args.pair, **options},
            "batch": args.batch,
            "unprofiled_ms_per_step": round(plain_s / args.tokens * 1e3, 3),
            **summarise(stats, args.tokens, args.top),
        }
        if args.against_plain:
            plain_engine_s, plain_stats = profile_engine("no_spec", target, draft, args.batch, args.tokens)
            report["no_spec_unprofiled_ms_per_step"] = round(plain_engine_s / args.tokens * 1e3, 3)
            report["beyond_no_spec"] = beyond(stats, plain_stats, args.tokens, args.top)
    emit_report(report, args.out)


if __name__ == "__main__":
    main()

"""Where a k = 0 step's time goes: cProfile of greedy decoding on an engine built in this process.

    PYTHONPATH=$PWD .venv/bin/python bench/k0_profile.py [--engine skip|no_spec] [--batch 8] [--tokens 200]
        [--pair trained | --pair perf --size S --agreement 0.6] [--out FILE]

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so the profiler sees the scheduler, the
runner and specserve's hooks together. After a warm-up generation, one generation of ``--batch`` prompts x
``--tokens`` tokens at k = 0 is profiled. Printed: the steps' profiled time, the self time of specserve's own
functions per step (the cost `bench/k0_step.py` cannot separate from noise), and the largest of them. The
profiler inflates Python-heavy code two to three times, so read the shares, not the absolute times.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import tempfile
import time
from pathlib import Path
from typing import Any

from k0_step import PROMPTS, engine_kwargs

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=("skip", "no_skip", "no_spec"), default="skip")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--pair", choices=("trained", "perf"), default="trained")
    parser.add_argument("--out", help="also write the JSON here")
    add_perf_options(parser, size="S", agreement=0.6)
    args = parser.parse_args()
    if not 1 <= args.batch <= len(PROMPTS):
        parser.error(f"--batch {args.batch}: must be 1..{len(PROMPTS)}")
    if args.tokens < 2:
        parser.error(f"--tokens {args.tokens}: must be at least 2")

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import SamplingParams

    from specserve.models import cached_pair
    from specserve.replicas import engine_env, offline

    options = {"size": args.size, "agreement": args.agreement} if args.pair == "perf" else {}
    pair = cached_pair(args.pair, **options)
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    prompts = PROMPTS[: args.batch]
    with engine_env.applied(engine_env.engine_env(tempfile.mkdtemp(prefix="specserve-k0-profile-"))):
        with offline.offline_llm(**engine_kwargs(args.engine, str(pair.target), str(pair.draft))) as llm:
            llm.generate(prompts, params, use_tqdm=False)  # warm-up
            started = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            plain_s = time.perf_counter() - started
            profile = cProfile.Profile()
            profile.runcall(llm.generate, prompts, params, use_tqdm=False)
    report = {
        "what": f"k=0 decode, {args.engine} engine, in process, cProfile",
        "pair": {"kind": args.pair, **options},
        "batch": args.batch,
        "unprofiled_ms_per_step": round(plain_s / args.tokens * 1e3, 3),
        **summarise(pstats.Stats(profile), args.tokens, args.top),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()

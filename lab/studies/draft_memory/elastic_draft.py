"""Elastic draft memory on a real vLLM engine (CPU): one offload -> expand -> contract -> reload cycle while
requests stream, against the same requests decoded without speculation.

    PYTHONPATH=$PWD .venv/bin/python lab/studies/draft_memory/elastic_draft.py \
        [--pair perf --size S --agreement 0.6 | --pair trained]
        [--requests 16] [--max-tokens 160] [--blocks 40] [--block-size 128] [--dtype bfloat16] [--out FILE]

One engine (fixed k = 4, a KV pool of ``--blocks`` blocks so the requests press on it). The requests arrive
two per step; once the slowest has 8 tokens the draft is offloaded and the pool grown by the draft's bytes;
at half its tokens the draft is reloaded (the grown region's live blocks migrate below it, the pool is cut, and
the draft is rebuilt on a worker thread while steps go on). Reported: outputs equal to plain decoding and none
lost, the worker's resident memory freed by the drop against the draft's bytes, the KV buffer's growth in bytes
against the same (the expanded pool's blocks hold no draft pages: the draft's share of every block is lent too),
the target's KV capacity in blocks before and after, the blocks migrated, the reload's time, the steps that ran
meanwhile and the longest gap between two steps then (against the run's median gap), and how long after the
reload the requests drafted again (catch-up), the engine's pause for the offload and for the contraction, and the
KV reserve (its address space, whether a resize moved it, the bytes the operating system backs before, during and
after the cycle). The EngineCore steps on its own, so the times between marks are read from this process and
include up to a few steps of slack.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from typing import Any

from lab.experiments.report_io import emit_report
from specserve.models.arguments import add_perf_options
from specserve.models.prompts import OPENINGS

PROMPTS = list(OPENINGS)


def stream(llm: Any, prompts: list[str], max_tokens: int, on_step: Any = None) -> dict[str, list[int]]:
    """Two requests join per step; ``on_step(slowest_tokens, num_unfinished)`` runs after every step."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    waiting = list(enumerate(prompts))
    tokens: dict[str, list[int]] = {}
    while waiting or engine.has_unfinished_requests():
        for i, prompt in waiting[:2]:
            engine.add_request(str(i), prompt, params)
        waiting = waiting[2:]
        for out in engine.step():
            tokens[out.request_id] = list(out.outputs[0].token_ids)
        if on_step is not None:
            slowest = min(len(tokens.get(str(i), [])) for i in range(len(prompts)))
            on_step(slowest)
    return tokens


def first_differences(tokens: dict[str, list[int]], reference: dict[str, list[int]]) -> list[tuple[str, int]]:
    out = []
    for request, want in sorted(reference.items()):
        got = tokens.get(request, [])
        if got != want:
            out.append((request, next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), -1)))
    return out


def window_gaps(steps: list[dict[str, Any]], last_step: int, from_step: int, to_step: int) -> list[float]:
    """Wall-clock gaps between the starts of consecutive steps, one for each step from ``from_step`` through
    ``to_step`` (from its start to the next one's). ``steps`` ends with step ``last_step``."""
    first_step = last_step - len(steps) + 1
    starts = [step["now_s"] for step in steps]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    return gaps[max(from_step - first_step, 0) : max(to_step + 1 - first_step, 0)]


def step_gaps(steps: list[dict[str, Any]], last_step: int, reload_step: int, resident_step: int) -> dict[str, Any]:
    """The longest gap between two steps from the reload's request until the draft was seen back, against the
    median gap over the run: a reload that blocked the engine would show as one gap as long as the reload."""
    window = window_gaps(steps, last_step, reload_step, resident_step)
    lo = max(reload_step - (last_step - len(steps) + 1), 0)
    fields = ("k", "duration_s", "num_batched_tokens", "num_draft_passes", "num_emitted_tokens")
    return {
        "longest_step_gap_while_reloading_s": max(window, default=float("nan")),
        "median_step_gap_s": statistics.median(window_gaps(steps, last_step, last_step - len(steps) + 1, last_step)),
        # Each gap of the window with the step that began it (``now_s`` is a step's start): the step's own duration
        # against the gap tells time the engine spent between two steps from a long step, and what the step ran
        # tells which (the one that catches the draft's KV up after the reload runs its passes over every token).
        "reload_window": [
            {"gap_s": gap, **{key: steps[lo + i].get(key) for key in fields}} for i, gap in enumerate(window)
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", choices=("trained", "perf"), default="perf")
    add_perf_options(parser, size="S", agreement=0.6)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--blocks", type=int, default=40, help="the KV pool's baseline blocks")
    parser.add_argument("--block-size", type=int, default=128, help="tokens per KV block (vLLM's CPU default: 128)")
    parser.add_argument(
        "--dtype",
        default="bfloat16",
        help="the engine's dtype; float32 takes the target's near-ties out of the output check (see the README)",
    )
    parser.add_argument(
        "--catch-up-max-tokens",
        type=int,
        help="most tokens a step catches the draft's KV up over (default: the engine's, 512 on CPU; a number at "
        "least the token budget, 2048 here, takes no cap)",
    )
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()

    from specserve.models import cached_pair
    from specserve.replicas.config import engine_env
    from specserve.replicas.config.engine_args import EngineSpec, speculative_engine_kwargs
    from specserve.replicas.tools import offline

    options = {"size": args.size, "agreement": args.agreement} if args.pair == "perf" else {}
    pair = cached_pair(args.pair, **options)
    prompts = [PROMPTS[i % len(PROMPTS)] + "#" * (i // len(PROMPTS)) for i in range(args.requests)]
    spec = EngineSpec(
        target=str(pair.target),
        draft=str(pair.draft),
        policy="fixed:k=4",
        max_k=4,
        max_num_seqs=16,
        dtype=args.dtype,
        catch_up_max_tokens=args.catch_up_max_tokens,
    )
    kwargs = {**speculative_engine_kwargs(spec), "num_gpu_blocks_override": args.blocks, "block_size": args.block_size}
    marks: dict[str, Any] = {}
    with engine_env.applied(engine_env.engine_env(tempfile.mkdtemp(prefix="specserve-elastic-bench-"))):
        with offline.offline_llm(**kwargs) as llm:
            offline.set_policy(llm, "fixed:k=0")
            print("plain decoding (k = 0, draft resident)...", file=sys.stderr)
            reference = stream(llm, prompts, args.max_tokens)
            offline.set_policy(llm, "fixed:k=4")
            start = offline.read_telemetry(llm)

            def kv_layout() -> dict[str, int]:
                (layout,) = llm.collective_rpc("specserve_kv_layout")[:1]
                return layout

            marks["kv_before"] = kv_layout()

            def on_step(slowest: int) -> None:
                now = time.perf_counter()
                if marks.get("offloaded") and "reload_asked_s" not in marks:
                    resident = kv_layout()["resident_bytes"]
                    marks["kv_resident_most"] = max(marks.get("kv_resident_most", 0), resident)
                if "offloaded" not in marks and slowest >= 8:
                    marks["offloaded"] = offline.offload_draft(llm)
                    marks["kv_offloaded"] = kv_layout()
                    print(f"offloaded: {marks['offloaded']}", file=sys.stderr)
                elif "reload_asked_s" not in marks and slowest >= args.max_tokens // 2:
                    marks["reload_asked_s"], marks["at_reload"] = now, offline.read_telemetry(llm)
                    offline.reload_draft(llm)
                elif "reload_asked_s" in marks and "resident_s" not in marks:
                    if offline.draft_memory(llm)["state"] == "resident":
                        marks["resident_s"], marks["at_resident"] = now, offline.read_telemetry(llm)
                elif "resident_s" in marks and "caught_up_s" not in marks:
                    now_t = offline.read_telemetry(llm)
                    if "drafting_s" not in marks and sum(now_t.speculation.num_drafted_per_pos) > sum(
                        marks["at_resident"].speculation.num_drafted_per_pos
                    ):
                        marks["drafting_s"] = now
                    caught_up = (
                        now_t.speculation.num_requests_caught_up - marks["at_reload"].speculation.num_requests_caught_up
                    )
                    if caught_up >= marks["at_reload"].load.num_running:
                        marks["caught_up_s"], marks["at_caught_up"] = now, now_t

            print("the cycle under load (fixed k = 4)...", file=sys.stderr)
            tokens = stream(llm, prompts, args.max_tokens, on_step)
            end, memory = offline.read_telemetry(llm), offline.draft_memory(llm)
            kv_after = kv_layout()
            steps = offline.read_step_log(llm, since_step=start.speculation.num_steps)
    offloaded = marks["offloaded"]
    grown_blocks = offloaded["kv_blocks_total"] - offloaded["kv_blocks_baseline"]
    buffer_baseline = offloaded["kv_blocks_baseline"] * offloaded["bytes_per_block"]
    target_block = offloaded["bytes_per_block"] - offloaded["draft_kv_bytes_per_block"]
    buffer_expanded = offloaded["kv_blocks_total"] * target_block
    report = {
        "what": "one offload -> expand -> contract -> reload cycle on a real vLLM engine while requests stream (CPU)",
        "pair": {"kind": args.pair, **options},
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "baseline_blocks": args.blocks,
        "block_size": args.block_size,
        "dtype": args.dtype,
        "catch_up_max_tokens": args.catch_up_max_tokens,
        "outputs_identical_to_plain_decoding": tokens == reference,
        # Per differing request: (request, first differing position); empty when identical.
        "first_differences": first_differences(tokens, reference),
        "requests_finished": sum(len(t) == args.max_tokens for t in tokens.values()),
        "draft_bytes": offloaded["draft_bytes"],
        "worker_rss_freed_bytes": offloaded["last_rss_freed_bytes"],
        "rss_freed_over_draft_bytes": offloaded["last_rss_freed_bytes"] / offloaded["draft_bytes"],
        "bytes_per_block": offloaded["bytes_per_block"],
        "draft_kv_bytes_per_block": offloaded["draft_kv_bytes_per_block"],
        "pool_grown_blocks": grown_blocks,
        "pool_blocks_expanded_over_baseline": offloaded["kv_blocks_total"] / offloaded["kv_blocks_baseline"],
        "kv_buffer_bytes_baseline": buffer_baseline,
        "kv_buffer_bytes_expanded": buffer_expanded,
        "kv_buffer_grown_over_draft_bytes": (buffer_expanded - buffer_baseline) / offloaded["draft_bytes"],
        "offload_s": memory["offload_s"],
        # The engine's pauses between two steps: the offload (drop, growth in place) and the contraction's last call
        # (migration, the pool cut in place, the rebuild started).
        "offload_pause_s": memory["last_offload_pause_s"],
        "contract_pause_s": memory["last_contract_pause_s"],
        # The KV reserve (kv_reserve.py): its address space, whether any resize moved it, and the bytes the
        # operating system backs before the cycle, at most while the draft was away, and after it.
        "kv_reserved_bytes": kv_after.get("reserved_bytes"),
        "kv_buffer_moved": kv_after.get("buffer_address") != marks["kv_before"].get("buffer_address"),
        "kv_resident_bytes_before": marks["kv_before"].get("resident_bytes"),
        "kv_resident_bytes_most_while_offloaded": marks.get("kv_resident_most"),
        "kv_resident_bytes_after": kv_after.get("resident_bytes"),
        "blocks_migrated": memory["blocks_migrated"],
        "migrate_s": memory["migrate_s"],
        "reload_s": memory["last_reload_s"],
        "steps_while_reloading": memory["last_reload_steps"],
        "steps_at_k0_while_reloading": memory["last_reload_steps_k0"],
        **step_gaps(
            steps,
            end.speculation.num_steps,
            marks["at_reload"].speculation.num_steps,
            marks["at_resident"].speculation.num_steps,
        ),
        "reload_to_drafting_s": marks.get("drafting_s", float("nan")) - marks["reload_asked_s"],
        # Every request running at the reload caught up: with a catch-up cap, over several steps.
        "reload_to_all_caught_up_s": marks.get("caught_up_s", float("nan")) - marks["reload_asked_s"],
        "steps_catching_up": (
            marks["at_caught_up"].speculation.num_steps - marks["at_resident"].speculation.num_steps
            if "at_caught_up" in marks
            else None
        ),
        "longest_step_gap_reload_to_caught_up_s": (
            max(
                window_gaps(
                    steps,
                    end.speculation.num_steps,
                    marks["at_reload"].speculation.num_steps,
                    marks["at_caught_up"].speculation.num_steps,
                ),
                default=float("nan"),
            )
            if "at_caught_up" in marks
            else None
        ),
        "worker_rss_restored_bytes": memory["last_rss_restored_bytes"],
        "steps_at_k0_while_offloaded": marks["at_reload"].speculation.num_steps_by_k[0]
        - start.speculation.num_steps_by_k[0],
        # Nothing catches up while the draft is away (every pass is skipped), so these are the reload's.
        "requests_caught_up_after_reload": end.speculation.num_requests_caught_up
        - marks["at_reload"].speculation.num_requests_caught_up,
        "catch_up_tokens_after_reload": end.speculation.num_catch_up_tokens
        - marks["at_reload"].speculation.num_catch_up_tokens,
    }
    emit_report(report, args.out)


if __name__ == "__main__":
    main()

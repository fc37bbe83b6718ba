"""The start-up calibration: dummy runs at every k that check the engine's speculation and time its steps.

A replica runs it after its engine starts and before it reports ready (``server.py``), and `specserve doctor` runs it
on an engine of its own: ``startup_checks.plan`` says which (k, batch) runs, each run is ``batch`` dummy requests
under ``fixed:k=K``, and the scheduler's and worker's counters around it (``check_counts``) feed
``startup_checks.evaluate``. Then the engine serves under its configured policy, warm-started from the runs' step
costs (never their acceptance), or, where a check failed, under the fallback ``fixed:k=max_k`` (vLLM's own
behaviour, which needs none of what the checks test) or not at all (``startup_checks: refuse``).

The engine is reached through ``CalibrationEngine``: an AsyncLLM in a replica, vLLM's offline ``LLM`` in `doctor` and
the tests. Private vLLM interfaces: those of ``offline.py`` and ``server.py`` (the engine's utility calls), and
``vllm.inputs.TokensPrompt`` / ``SamplingParams`` (public).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from specserve.replicas.config.engine_args import (
    ADDITIONAL_CONFIG_KEY,
    EngineControlConfig,
    Utility,
)
from specserve.speculation.startup_checks import (
    CALIBRATION_MAX_TOKENS,
    CALIBRATION_PROMPT_TOKENS,
    CheckCounts,
    CheckResult,
    Probe,
    ProbeResult,
    evaluate,
    failed,
    plan,
)

logger = logging.getLogger("ray.serve")


class CalibrationEngine(Protocol):
    async def call(self, utility: str, *args: Any) -> Any: ...

    async def run(self, prompts: list[list[int]], max_tokens: int) -> None: ...


@dataclass(frozen=True, slots=True)
class Calibration:
    """What a calibration found and what the engine serves under afterwards."""

    checks: tuple[CheckResult, ...]
    results: tuple[ProbeResult, ...]
    policy: str
    seconds: float

    @property
    def failed(self) -> tuple[str, ...]:
        return failed(self.checks)


class StartupCheckFailed(RuntimeError):
    """A start-up check failed where the config says to refuse serving (``speculation.startup_checks: refuse``)."""


async def calibrate(
    engine: CalibrationEngine,
    *,
    policy: str,
    max_k: int,
    max_num_seqs: int,
    skips_k0_draft_pass: bool,
    signals: bool,
    on_failure: str = "fallback",
    batch_sizes: Sequence[int] | None = None,
) -> Calibration:
    """Run the probes (at ``batch_sizes``, ``startup_checks.batch_sizes`` of the engine's unless given), judge the
    checks, and leave the engine serving under ``policy`` (or the fallback)."""
    started = time.monotonic()
    # A warm-up request first: an engine's first steps pay one-off work (the CPU engine lays its KV cache out in a
    # reserve on its first step, seconds), which no later step costs and which the policy must not learn as a step's.
    await engine.call(Utility.SET_POLICY, "fixed:k=0", False)
    await engine.run(dummy_prompts(-1, 1), 4)
    warmed_up = CheckCounts(**await engine.call(Utility.CHECK_COUNTS)).num_steps
    results = []
    for index, probe in enumerate(plan(max_k, max_num_seqs, batch_sizes)):
        await engine.call(Utility.SET_POLICY, f"fixed:k={probe.k}", False)
        before = CheckCounts(**await engine.call(Utility.CHECK_COUNTS))
        await engine.run(dummy_prompts(index, probe.batch), CALIBRATION_MAX_TOKENS)
        after = CheckCounts(**await engine.call(Utility.CHECK_COUNTS))
        steps = await engine.call(Utility.STEP_LOG, before.num_steps)
        results.append(ProbeResult(probe, after - before, decode_step_seconds(probe, steps)))
    checks = tuple(evaluate(results, skips_k0_draft_pass=skips_k0_draft_pass, signals=signals))
    bad = failed(checks)
    for check in checks:
        if not check.ok:
            logger.error(
                "specserve: start-up check %s failed: expected %s; seen %s", check.name, check.expected, check.seen
            )
    serving = policy if not bad else f"fixed:k={max_k}"
    if bad and on_failure == "refuse":
        raise StartupCheckFailed(
            "specserve: start-up checks failed: "
            + "; ".join(f"{c.name}: expected {c.expected}, seen {c.seen}" for c in checks if not c.ok)
        )
    serving = await engine.call(Utility.END_CALIBRATION, serving, list(bad), warmed_up)
    if bad:
        logger.warning("specserve: serving under %s, the fallback, until the engine restarts", serving)
    return Calibration(checks, tuple(results), serving, time.monotonic() - started)


async def calibrate_engine(
    engine: CalibrationEngine, engine_kwargs: dict[str, Any], max_num_seqs: int, on_failure: str = "fallback"
) -> Calibration:
    """``calibrate`` with the policy, max_k, skip and signals the engine was built with (its vLLM arguments)."""
    control = EngineControlConfig.from_additional_config(engine_kwargs["additional_config"][ADDITIONAL_CONFIG_KEY])
    return await calibrate(
        engine,
        policy=control.policy,
        max_k=engine_kwargs["speculative_config"]["num_speculative_tokens"],
        max_num_seqs=max_num_seqs,
        skips_k0_draft_pass=control.skip_k0_draft_pass,
        signals=control.draft_signals,
        on_failure=on_failure,
    )


def describe(check: CheckResult) -> tuple[str, str, str]:
    return check.name, check.expected, check.seen


def dummy_prompts(probe_index: int, batch: int) -> list[list[int]]:
    """Token ids no two requests share a first token of (so no prefix-cache hit joins two runs), within any
    vocabulary of a few hundred ids."""
    return [
        [3 + (probe_index * 31 + request * 7 + position) % 251 for position in range(CALIBRATION_PROMPT_TOKENS)]
        for request in range(batch)
    ]


def decode_step_seconds(probe: Probe, steps: Sequence[dict[str, Any]]) -> tuple[float, ...]:
    """Durations of the probe's decode-only steps at its full batch (every request computing one token plus the
    drafts it verifies)."""
    return tuple(
        float(s["duration_s"])
        for s in steps
        if s["k"] == probe.k
        and s["num_running"] == probe.batch
        and s["num_batched_tokens"] <= probe.batch * (probe.k + 1)
    )


class AsyncLLMEngine:
    """``CalibrationEngine`` over a replica's AsyncLLM."""

    def __init__(self, engine_client: Any) -> None:
        self._client = engine_client

    async def call(self, utility: str, *args: Any) -> Any:
        return await self._client.engine_core.call_utility_async(utility, *args)

    async def run(self, prompts: list[list[int]], max_tokens: int) -> None:
        import asyncio
        import uuid

        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)

        async def one(prompt: list[int]) -> None:
            request_id = f"specserve-calibration-{uuid.uuid4().hex}"
            async for _ in self._client.generate(TokensPrompt(prompt_token_ids=prompt), params, request_id):
                pass

        await asyncio.gather(*(one(p) for p in prompts))


class OfflineEngine:
    """``CalibrationEngine`` over vLLM's offline ``LLM`` (its calls block; nothing else runs beside them)."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm

    async def call(self, utility: str, *args: Any) -> Any:
        return self._llm.llm_engine.engine_core.call_utility(utility, *args)

    async def run(self, prompts: list[list[int]], max_tokens: int) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        self._llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)

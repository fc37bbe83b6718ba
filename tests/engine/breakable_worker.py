"""A worker extension that breaks one assumption of specserve's k control on purpose, on request, for the start-up
checks' tests: one engine serves every case. Named as ``worker_extension_cls``; a test calls
``collective_rpc("specserve_test_break", args=(NAME,))`` (None: mend everything).

- ``drafts_max_k``: the proposer drafts max_k tokens whatever k the step asks, as vLLM's Model Runner V2
  draft-model speculator does on a GPU (check ``k_honoured``);
- ``never_skips``: the worker runs the draft's pass on k = 0 decode steps too, against the scheduler's plan
  (check ``k0_no_draft_pass``);
- ``no_signals``: drafts reach the scheduler without the draft's confidences, vLLM's own ``take_draft_token_ids``
  (check ``draft_signals``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from specserve.replicas.worker import draft_signals
from specserve.replicas.worker import extension as draft_skip
from specserve.replicas.worker.extension import DraftSkipWorkerExtension

# vLLM resolves this class by its own name, which installs nothing (extension.INSTALLED does): install here.
draft_skip.install()

_mended = {
    "propose": draft_skip._original_propose,
    "runner_skips": draft_skip.runner_skips,
    "step_plan": draft_skip.step_plan,
    "take": GPUModelRunner.take_draft_token_ids,
}


def _propose_max_k(runner: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
    widest = dataclasses.replace(
        scheduler_output, num_spec_tokens_to_schedule=runner.speculative_config.num_speculative_tokens
    )
    return _mended["propose"](runner, widest, *args, **kwargs)


class Breakable(DraftSkipWorkerExtension):
    def specserve_test_break(self, name: str | None) -> None:
        draft_skip._original_propose = _mended["propose"]
        draft_skip.runner_skips = _mended["runner_skips"]
        draft_skip.step_plan = _mended["step_plan"]
        GPUModelRunner.take_draft_token_ids = _mended["take"]
        if name == "drafts_max_k":
            draft_skip._original_propose = _propose_max_k
        elif name == "never_skips":
            draft_skip.runner_skips = lambda runner: False
            draft_skip.step_plan = lambda output: dataclasses.replace(_mended["step_plan"](output), skip=False)
        elif name == "no_signals":
            GPUModelRunner.take_draft_token_ids = draft_signals._original_take
        elif name is not None:
            raise ValueError(f"nothing to break called {name!r}")

"""One engine step as a JSON line: the context its policy chose k from, and the record of what the step ran.

An engine started with a step log (``step_log`` in the serve config) appends one line per step; a policy's
decisions can then be replayed offline exactly (the lab's ``lab/studies/policy_replay/policy_replay.py``): the same
contexts in, the same records observed, so a fresh policy of the same spec chooses the k the engine's did, and every
prediction it made along the way can be read. The policy spec travels in each line, so the runs of a
``bench compare`` that switched policies on one engine split apart again.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specserve.speculation.types import EngineTraits, StepContext, StepRecord


@dataclass(frozen=True, slots=True)
class LoggedStep:
    engine: str  # which engine wrote it (several replicas may share one file)
    policy: str  # the spec of the policy that chose this step's k
    traits: EngineTraits  # the engine's, which the policy was built with
    ctx: StepContext
    record: StepRecord


def encode(engine: str, policy: str, traits: EngineTraits, ctx: StepContext, record: StepRecord) -> str:
    return json.dumps(
        {
            "engine": engine,
            "policy": policy,
            "traits": dataclasses.asdict(traits),
            "ctx": dataclasses.asdict(ctx),
            "record": dataclasses.asdict(record),
        }
    )


def decode(line: str) -> LoggedStep:
    data = json.loads(line)
    return LoggedStep(
        str(data["engine"]),
        str(data["policy"]),
        EngineTraits(**data["traits"]),
        StepContext(
            **{
                **data["ctx"],
                "request_ids": tuple(data["ctx"]["request_ids"]),
                "kv_blocks_needed": tuple(data["ctx"].get("kv_blocks_needed", ())),
            }
        ),
        StepRecord(**{name: _tuples(value) for name, value in data["record"].items()}),
    )


def read(lines: Iterable[str]) -> Iterator[LoggedStep]:
    """The steps of a log, in order; blank lines skipped."""
    for line in lines:
        if line.strip():
            yield decode(line)


def load(path: Path) -> list[LoggedStep]:
    """Every step of a log file. ValueError naming the file where it is missing or not a step log."""
    if not path.is_file():
        raise ValueError(f"{path} is not a file")
    try:
        with path.open() as f:
            return list(read(f))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a step log: {exc!r}") from exc


def _tuples(value: Any) -> Any:
    """JSON's lists back to the record's (nested) tuples."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value

"""The papers' numbers as data: the YAML files under ``papers/`` read through closed pydantic schemas.

Every number the campaign quotes or computes with lives in one of these files beside its citation (the paper's own
section, table, figure or equation), never in Python: ``<paper>.yaml`` holds what ``sim reproduce`` sets beside our
runs (one file per paper), ``step_times.yaml`` the step times ``sim latency-check`` prices. Unknown keys are errors
that name the key (``extra="forbid"``).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

PAPERS_DIR = Path(__file__).resolve().parent / "papers"
STEP_TIMES_FILE = PAPERS_DIR / "step_times.yaml"
# The reproduce files, in report order (``sim reproduce`` with no --seed-paper runs them all, in this order).
REPRODUCED = ("turbospec", "nightjar", "adaspec", "dsde", "speckv")
# Run summary keys a paper's speedups may be computed on (metrics.summarize).
Metric = Literal["throughput_tok_s", "mean_e2e_s", "mean_tpot_s", "slo_attainment"]


class PaperDataError(ValueError):
    """A file under papers/ is wrong; the message names the file and the key."""


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CitedNumber(_Closed):
    """A number as the paper prints it, and where it prints it."""

    values: list[float] = Field(min_length=1, description="one number, or several whose mean is used (one per QPS)")
    cite: str = Field(description="the paper's section, table or figure, and what the number is")

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)


class PaperRef(_Closed):
    """The paper's counterpart of one of our policies."""

    label: str = Field(description="the paper's name for the method")
    quote: str = Field(description="its headline number(s) as the report shows them, each with its citation")
    metric: CitedNumber | None = Field(
        None, description="the paper's value on its metric; the speedup is taken against the baseline's value"
    )
    speedup: CitedNumber | None = Field(None, description="the speedup as the paper prints it, when it gives no value")

    @model_validator(mode="after")
    def _one_source(self) -> PaperRef:
        if self.metric is not None and self.speedup is not None:
            raise ValueError("give metric or speedup, not both")
        return self


class PaperRun(_Closed):
    scenario: str = Field(description="built-in scenario name")
    policies: list[str] = Field(min_length=1, description="policy specs, in table order")
    refs: dict[str, PaperRef] = Field(default_factory=dict, description="policy spec -> its counterpart in the paper")
    not_comparable: str = Field(description="one sentence: why absolute numbers differ")
    shape: str = Field(description="what the paper says the comparison looks like, with citations")


class Paper(_Closed):
    name: str
    title: str = Field(description="short name used in headings")
    reference: str = Field(description="authors and full title")
    metric: Metric = Field(description="our summary key the speedup column is computed on")
    higher_is_better: bool = Field(description="of our metric")
    baseline: str = Field(description="policy spec the speedups are relative to (ours and the paper's)")
    paper_metric_higher_is_better: bool = Field(
        description="of the paper's numbers in refs.*.metric (throughput: true; latency: false)"
    )
    runs: list[PaperRun] = Field(min_length=1)
    numbers: dict[str, CitedNumber] = Field(default_factory=dict, description="further numbers a summary quotes")
    summary: Literal["dsde_sweep"] | None = Field(None, description="markdown written before the per-run tables")

    @model_validator(mode="after")
    def _refs_name_run_policies(self) -> Paper:
        for run in self.runs:
            if self.baseline not in run.policies:
                raise ValueError(f"run {run.scenario!r}: baseline {self.baseline!r} is not among its policies")
            unknown = [spec for spec in run.refs if spec not in run.policies]
            if unknown:
                raise ValueError(f"run {run.scenario!r}: refs for policies it does not run: {', '.join(unknown)}")
            base = run.refs.get(self.baseline)
            if any(ref.metric for ref in run.refs.values()) and (base is None or base.metric is None):
                raise ValueError(f"run {run.scenario!r}: refs give metric values but the baseline's ref has none")
        return self

    def paper_speedup(self, run: PaperRun, spec: str) -> float | None:
        """The paper's speedup of ``spec``'s counterpart over the baseline's (>1 better); None: not given."""
        ref = run.refs.get(spec)
        if ref is None:
            return None
        if ref.speedup is not None:
            return ref.speedup.mean
        if ref.metric is None:
            return None
        base_metric = run.refs[self.baseline].metric
        assert base_metric is not None  # _refs_name_run_policies: refs with metrics need the baseline's
        base = base_metric.mean
        value = ref.metric.mean
        return value / base if self.paper_metric_higher_is_better else base / value


class PaperPoint(_Closed):
    """One step time, draft share or step ratio a paper reports, with the setting to price it."""

    id: str
    paper: str = Field(
        description="source: turbospec, nightjar, adaspec, dsde, speckv, or anchors (vLLM's own numbers)"
    )
    cite: str = Field(description="paper, section, table or figure, and the numbers as printed")
    quantity: Literal["step_s", "draft_share", "step_ratio"]
    hardware: str = Field(description="name in hardware.yaml")
    target: str = Field(description="name in models.yaml")
    draft: str | None = Field(description="name in models.yaml; null: a plain engine with no draft pass")
    tp: int = Field(1, gt=0, description="the target's tensor-parallel size; the draft runs at TP 1")
    batch_size: float = Field(gt=0, description="decoding requests per step (a mean may be fractional)")
    context_tokens: float = Field(ge=0, description="cached tokens per request")
    k: float = Field(ge=0, description="drafts per request; the target scores k + 1 tokens per request")
    k_ref: float | None = Field(None, ge=0, description="step_ratio only: the denominator's k")
    cuda_graphs: bool = Field(True, description="false where the paper ran the engine eagerly")
    measured: float = Field(gt=0, description="seconds for step_s, a fraction for draft_share, a ratio")
    derived: bool = Field(False, description="computed from what the paper reports, not read off it")
    setting: Literal["stated", "inferred"] = Field("stated", description="inferred: the note says what is ours")
    note: str = ""


class ExcludedNumber(_Closed):
    """A number read and not used, and why."""

    paper: str
    what: str
    reason: str


class PaperData(_Closed):
    """step_times.yaml: the points ``sim latency-check`` prices, and the numbers it reads and does not use."""

    points: list[PaperPoint] = Field(min_length=1)
    numbers: dict[str, CitedNumber] = Field(default_factory=dict, description="further numbers the report quotes")
    excluded: list[ExcludedNumber] = Field(default_factory=list)


_Model = TypeVar("_Model", bound=BaseModel)


def load_yaml(path: Path, schema: type[_Model]) -> _Model:
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise PaperDataError(f"{path.name} is not valid YAML: {exc}") from None
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(part) for part in err["loc"]) or "(root)"
        raise PaperDataError(f"{path.name}: {where}: {err['msg']}") from None


@cache
def reproduced_papers() -> dict[str, Paper]:
    """Every paper ``sim reproduce`` knows, by name, in report order."""
    papers = {}
    for name in REPRODUCED:
        paper = load_yaml(PAPERS_DIR / f"{name}.yaml", Paper)
        if paper.name != name:
            raise PaperDataError(f"{name}.yaml: name {paper.name!r} is not the file's")
        papers[name] = paper
    return papers

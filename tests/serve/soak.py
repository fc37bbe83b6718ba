"""The soak's parts: clients whose number follows a schedule and whose requests mix streaming and plain, chat and
completions; a sampler of every serve process's RSS; counters read from the metrics port; the plot."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
import requests
from closed_loop import CLIENT_TIMEOUT_S, MODEL, ClientThreads
from prometheus_client.parser import text_string_to_metric_families

PROMPTS = ("def fib(n):", "import numpy as np\n", "class Stack:\n    def push(self, item):", "for i in range(10):")


@dataclass(frozen=True, slots=True)
class Request:
    kind: str  # "completions", "completions-stream", "chat-stream"
    start_s: float
    end_s: float
    status: int | None  # None: the client got an exception, named in ``detail``
    prompt_tokens: int
    completion_tokens: int  # as the response's usage states it
    detail: str = ""


def _send(endpoint: str, kind: str, rng: random.Random) -> tuple[int | None, int, int, str]:
    """One request; its status, and the token counts of its usage (0 where it had none)."""
    body: dict = {"model": MODEL, "max_tokens": rng.randint(8, 96), "temperature": rng.choice((0.0, 0.8))}
    prompt = rng.choice(PROMPTS)
    if kind.startswith("chat"):
        path, body["messages"] = "chat/completions", [{"role": "user", "content": prompt}]
    else:
        path, body["prompt"] = "completions", prompt
    stream = kind.endswith("stream")
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    with requests.post(f"{endpoint}/{path}", json=body, stream=stream, timeout=CLIENT_TIMEOUT_S) as response:
        if response.status_code != 200:
            return response.status_code, 0, 0, response.text[:2000]
        if not stream:
            usage = response.json()["usage"]
            return 200, usage["prompt_tokens"], usage["completion_tokens"], ""
        usage, chunks = None, 0
        for line in response.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:  # an error after the 200: the stream's own error event
                return 500, 0, 0, json.dumps(chunk)[:2000]
            chunks += bool(chunk.get("choices"))
            usage = chunk.get("usage") or usage
        if usage is None or chunks == 0:
            return 200, 0, 0, f"stream ended with {chunks} chunks and usage {usage}"
        return 200, usage["prompt_tokens"], usage["completion_tokens"], ""


@dataclass
class ScheduledLoad(ClientThreads):
    """Closed-loop clients; client ``i`` sends only while the schedule's level at that moment is above ``i``."""

    endpoint: str
    levels: tuple[int, ...]  # active clients, one entry per phase, cycled
    phase_s: float
    seed: int = 0
    started_s: float = field(default_factory=time.monotonic)
    requests: list[Request] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def level(self, at_s: float) -> int:
        return self.levels[int(at_s // self.phase_s) % len(self.levels)]

    def num_clients(self) -> int:
        return max(self.levels)

    def _client(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        while not self._stop.is_set():
            if self.level(self.now()) <= index:
                time.sleep(0.2)
                continue
            kind = rng.choice(("completions", "completions-stream", "chat-stream"))
            start = self.now()
            try:
                status, prompt, completion, detail = _send(self.endpoint, kind, rng)
            except (requests.RequestException, ValueError, KeyError) as exc:
                status, prompt, completion, detail = None, 0, 0, f"{type(exc).__name__}: {exc}"[:2000]
            self.requests.append(Request(kind, start, self.now(), status, prompt, completion, detail))
            if status != 200 or detail:
                time.sleep(0.2)  # a failing server answers at once; do not spin on it


@dataclass
class RssSampler:
    """Every ``interval_s``, the RSS of the serve process and every descendant: Ray's, Serve's and vLLM's."""

    root: psutil.Process
    interval_s: float = 5.0
    started_s: float = field(default_factory=time.monotonic)
    samples: list[tuple[float, int, str, int]] = field(default_factory=list)  # (s, pid, name, rss bytes)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> RssSampler:
        self.started_s = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic() - self.started_s
            for process in [self.root, *self.root.children(recursive=True)]:
                try:
                    name = " ".join(process.cmdline())[:60] or process.name()
                    self.samples.append((now, process.pid, name, process.memory_info().rss))
                except psutil.Error:
                    continue
            self._stop.wait(self.interval_s)

    def by_process(self) -> dict[int, tuple[str, list[tuple[float, int]]]]:
        series: dict[int, tuple[str, list[tuple[float, int]]]] = {}
        for at_s, pid, name, rss in self.samples:
            series.setdefault(pid, (name, []))[1].append((at_s, rss))
        return series


def counter_totals(metrics_url: str, names: tuple[str, ...]) -> dict[str, float]:
    """Each counter summed over its label sets, as the metrics port exports it now."""
    text = requests.get(metrics_url, timeout=10).text
    totals = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return totals


def settled_totals(metrics_url: str, names: tuple[str, ...], timeout_s: float = 90.0) -> dict[str, float]:
    """Counters once two reads an export cycle apart (Ray exports about every 10 s) agree."""
    deadline = time.monotonic() + timeout_s
    before = counter_totals(metrics_url, names)
    while time.monotonic() < deadline:
        time.sleep(12)
        now = counter_totals(metrics_url, names)
        if now == before:
            return now
        before = now
    raise TimeoutError(f"counters still moving after {timeout_s} s: {before}")


def plot(path: Path, load: ScheduledLoad, rss: RssSampler, switches: list[tuple[float, str]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_load, ax_lat, ax_rss) = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    end_s = max((r.end_s for r in load.requests), default=0.0)
    bins: dict[int, int] = defaultdict(int)
    for r in load.requests:
        bins[int(r.end_s // 10)] += r.completion_tokens
    xs = sorted(bins)
    ax_load.bar([10 * x + 5 for x in xs], [bins[x] / 10 for x in xs], width=9, color="tab:blue", alpha=0.6)
    ax_load.set_ylabel("tokens/s received")
    twin = ax_load.twinx()
    grid = [i * 2.0 for i in range(int(end_s / 2) + 1)]
    twin.step(grid, [load.level(t) for t in grid], where="post", color="black", label="active clients")
    twin.set_ylabel("active clients")
    for at_s, spec in switches:
        ax_load.axvline(at_s, color="tab:red", lw=0.8, ls="--")
        ax_load.text(at_s, ax_load.get_ylim()[1] * 0.95, spec, rotation=90, va="top", fontsize=7, color="tab:red")
    for kind, color in (
        ("completions", "tab:green"),
        ("completions-stream", "tab:orange"),
        ("chat-stream", "tab:purple"),
    ):
        mine = [r for r in load.requests if r.kind == kind]
        ax_lat.scatter([r.start_s for r in mine], [r.end_s - r.start_s for r in mine], s=3, color=color, label=kind)
    ax_lat.set_ylabel("request latency (s)")
    ax_lat.legend(loc="upper right", fontsize=8)
    series = rss.by_process()
    biggest = sorted(series.items(), key=lambda kv: -max(v for _, v in kv[1][1]))[:8]
    for pid, (name, points) in biggest:
        ax_rss.plot([t for t, _ in points], [v / 2**20 for _, v in points], lw=1, label=f"{name[:40]} ({pid})")
    ax_rss.set_ylabel("RSS (MiB)")
    ax_rss.set_xlabel("seconds into the soak")
    ax_rss.legend(loc="center left", fontsize=7)
    fig.suptitle("specserve soak: load, policy switches, latency, and every process's memory")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_json(path: Path, summary: dict, load: ScheduledLoad, rss: RssSampler) -> None:
    path.write_text(
        json.dumps(
            {"summary": summary, "requests": [asdict(r) for r in load.requests], "rss": rss.samples}, indent=None
        )
    )

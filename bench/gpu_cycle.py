"""The whole elastic-draft cycle on one GPU, torch and the CUDA driver only (no vLLM): a target and a draft decode
while a burst drives the draft out and back, the residency state machine deciding every move.

    PYTHONPATH=. python3 bench/gpu_cycle.py --out bench/results/gpu/cycle-h200.jsonl [--small] [--replays 2]
        [--deterministic] [--dtype float32]

What runs is a small decoding engine of its own: Llama-shaped decoders (random weights, bf16 unless --dtype,
RMSNorm, grouped attention over a paged KV cache, no rotary embedding), greedy, one decode step for every
running request per step, the draft's forward beside the target's while the draft is resident (its proposals
are recorded, not verified: what matters here is the memory under them). A request is admitted once every block
it will take is free beside what the running ones still need; blocks are taken as requests grow, lowest id
first. Its KV cache is a ``KvReserve`` over CUDA virtual memory, the draft's weights ``ParkedWeights``, and every
decision comes from ``specserve.memory``'s ``ResidencyMachine`` over a ``KvCapacity`` of the real byte counts,
the code the CPU engine and the simulator run:

1. long requests decode; a burst arrives and fills the pool (the stand-in policy keeps k = 0 while more than the
   long requests run); free memory is first filled to half the bytes the offload will lend, so the grown pool
   fits only once the draft is gone;
2. **offload**: the weights' chunks are unmapped, the draft's KV pages lent; **expand**: the reserve maps the
   extra region and the allocator hands out its ids;
3. the burst drains; **contract**: the machine's migration plan moves the long requests' blocks out of the
   extra region (a copy per target layer), the tails are unmapped, the draft's KV pages mapped again (zeroed);
4. **reload** on a side stream while target steps go on; once its event completes, the draft's KV is rebuilt
   over every running request's context (one forward per request) and it drafts again.

A second run replays the same admissions with the draft resident throughout and the pool at full size from the
start. Checks: every request's target tokens identical between the runs (blocks moved, grown, trimmed and
remapped hold what they held), and after the catch-up the draft's proposals those of a draft that never left.
That holds only where the engine is deterministic: ``--replays 2`` compares two replays as well. At the full
size on an H200 two replays differ with the default kernels; with ``--deterministic`` they agree, and so do the
cycle's target tokens. The draft after its catch-up then proposes what the never-offloaded draft proposes in
float32 (``--dtype float32``) but not always in bf16: its KV was rebuilt by one prefill-shaped forward, the
replay's written one decode step at a time, and bf16 rounds the two differently.
One JSON object per line: ``setup``, one ``step`` per step (state, batch, k, milliseconds, tokens), one ``event``
per transition (seconds, bytes by the driver's count), ``check`` and ``check replay``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specserve.memory import (
    ExpandPool,
    KvCapacity,
    MemoryStep,
    ResidencyMachine,
    StartContraction,
    StartOffload,
    StartReload,
)
from specserve.replicas.draft_memory.draft_vmm import ParkedWeights
from specserve.replicas.draft_memory.kv_reserve import KvReserve, plain_layout

BLOCK = 16  # tokens a block
KV_HEADS, HEAD_DIM = 8, 128
VOCAB = 32000
DEVICE = "cuda"
DTYPE = torch.bfloat16  # --dtype float32: rounding out of the question when the draft is compared
TARGET_PREFIX, DRAFT_PREFIX = "model.layers.", "draft_model.model.layers."


@dataclass(frozen=True)
class Size:
    target_layers: int
    target_hidden: int
    draft_layers: int
    draft_hidden: int
    base_blocks: int  # the pool with the draft resident (block 0 is never handed out, as in vLLM)
    long_requests: int
    long_prompt: int
    long_output: int
    burst_requests: int
    burst_prompt: int
    burst_output: int
    burst_at_step: int
    table_width: int  # block-table columns: the longest request's blocks


FULL = Size(16, 4096, 4, 2048, 256, 8, 64, 220, 48, 128, 64, 10, 18)
SMALL = Size(2, 1024, 1, 1024, 64, 4, 32, 96, 28, 32, 24, 4, 9)


class Decoder(nn.Module):
    def __init__(self, layers: int, hidden: int) -> None:
        super().__init__()
        heads, kv, mlp = hidden // HEAD_DIM, KV_HEADS * HEAD_DIM, hidden * 11 // 4
        self.heads = heads
        self.embed = nn.Embedding(VOCAB, hidden)
        self.layers = nn.ModuleList(
            nn.ModuleDict(
                {
                    "qkv": nn.Linear(hidden, hidden + 2 * kv, bias=False),
                    "o": nn.Linear(hidden, hidden, bias=False),
                    "up": nn.Linear(hidden, 2 * mlp, bias=False),
                    "down": nn.Linear(mlp, hidden, bias=False),
                }
            )
            for _ in range(layers)
        )
        self.head = nn.Linear(hidden, VOCAB, bias=False)
        for p in self.parameters():
            nn.init.normal_(p, std=hidden**-0.5)

    def forward(self, tokens: torch.Tensor, starts: torch.Tensor, tables: torch.Tensor, caches: list) -> torch.Tensor:
        """Logits after the last of ``tokens`` (B, T) of requests whose first new position is ``starts`` (B,);
        each layer writes its K and V into ``caches[i]`` (blocks, 2, BLOCK, heads, dim) at ``tables`` (B, W)."""
        batch, num = tokens.shape
        pos = starts[:, None] + torch.arange(num, device=tokens.device)
        blocks, offsets = tables.gather(1, pos // BLOCK), pos % BLOCK
        keys = torch.arange(tables.shape[1] * BLOCK, device=tokens.device)
        mask = (keys[None, None, :] <= pos[:, :, None])[:, None]  # (B, 1, T, W * BLOCK)
        x = self.embed(tokens)
        for layer, cache in zip(self.layers, caches, strict=True):
            q, k, v = layer["qkv"](F.rms_norm(x, x.shape[-1:])).split(
                [x.shape[-1], KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1
            )
            cache[blocks, 0, offsets] = k.view(batch, num, KV_HEADS, HEAD_DIM)
            cache[blocks, 1, offsets] = v.view(batch, num, KV_HEADS, HEAD_DIM)
            kv = cache[tables].transpose(2, 3).flatten(1, 2)  # (B, W * BLOCK, 2, heads, dim)
            keys_, values = (kv[:, :, i].transpose(1, 2) for i in (0, 1))
            out = F.scaled_dot_product_attention(
                q.view(batch, num, self.heads, HEAD_DIM).transpose(1, 2), keys_, values, mask, enable_gqa=True
            )
            x = x + layer["o"](out.transpose(1, 2).flatten(2))
            gate, up = layer["up"](F.rms_norm(x, x.shape[-1:])).chunk(2, dim=-1)
            x = x + layer["down"](F.silu(gate) * up)
        return self.head(F.rms_norm(x[:, -1], x.shape[-1:]))


def page_bytes() -> int:
    return 2 * BLOCK * KV_HEADS * HEAD_DIM * DTYPE.itemsize  # K and V


def make_reserve(size: Size, capacity: int, draft_capacity: int) -> KvReserve:
    names = [f"{TARGET_PREFIX}{i}" for i in range(size.target_layers)]
    names += [f"{DRAFT_PREFIX}{i}" for i in range(size.draft_layers)]
    return KvReserve(plain_layout(names, page_bytes(), size.base_blocks), capacity, draft_capacity, device=DEVICE)


def views(reserve: KvReserve, draft: bool, num_blocks: int) -> list[torch.Tensor]:
    shape = (num_blocks, 2, BLOCK, KV_HEADS, HEAD_DIM)
    return [
        reserve.raw[r.start : r.start + num_blocks * r.page].view(DTYPE).view(shape) for r in reserve.regions(draft)
    ]


@dataclass
class Request:
    rid: int
    prompt: list[int]
    max_tokens: int
    blocks: list[int] = field(default_factory=list)
    out: list[int] = field(default_factory=list)
    drafted: dict[int, int] = field(default_factory=dict)  # step -> the draft's greedy next token
    drafted_from: int = -1  # the first step after the draft's catch-up

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.out

    @property
    def final_blocks(self) -> int:
        return -(-(len(self.prompt) + self.max_tokens) // BLOCK)


class Allocator:
    """Lowest free id first, so the extra region is handed out only once the preserved one is full."""

    def __init__(self, num_blocks: int) -> None:
        self.limit = num_blocks
        self.free = set(range(1, num_blocks))  # block 0 stays empty: padding in block tables points at it

    def take(self) -> int:
        if not self.free:
            raise RuntimeError("KV pool exhausted: the admission margin is too small")
        block = min(self.free)
        self.free.remove(block)
        return block

    def give(self, ids: list[int]) -> None:
        self.free.update(block for block in ids if block < self.limit)

    def resize(self, num_blocks: int) -> None:
        """Hand out ids up to ``num_blocks``: more (an expansion) or fewer (a contraction, its moves done)."""
        self.free = {block for block in self.free if block < num_blocks} | set(range(self.limit, num_blocks))
        self.limit = num_blocks


class PoolView:
    """The residency machine's ``BlockLayout``: which blocks of the extra region are live, which below it free."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def live_extra_blocks(self) -> list[int]:
        base = self.engine.capacity.num_base_blocks
        return [block for r in self.engine.running for block in r.blocks if block >= base]

    def free_base_blocks(self, count: int) -> list[int]:
        base = self.engine.capacity.num_base_blocks
        return sorted(block for block in self.engine.alloc.free if block < base)[:count]


@dataclass(frozen=True)
class PendingReload:
    """A reload's copy in flight on the side stream, between two timing events."""

    start: torch.cuda.Event
    end: torch.cuda.Event  # recorded after the copy: done once it completes
    issued_s: float
    first_step: int


class Engine:
    def __init__(self, size: Size, target: Decoder, draft: Decoder, cycle: bool, emit: Callable[[dict], None]):
        self.size, self.target, self.draft, self.emit = size, target, draft, emit
        # The draft is parked in the cycle run only; the replay's stays where it was loaded.
        self.parked = ParkedWeights(draft) if cycle else None
        draft_kv = page_bytes() * size.draft_layers
        self.capacity = KvCapacity(
            num_base_blocks=size.base_blocks,
            draft_bytes=self.parked.num_bytes if self.parked else sum(t.nbytes for t in draft.parameters()),
            bytes_per_block=page_bytes() * size.target_layers + draft_kv,
            draft_kv_bytes_per_block=draft_kv,
        )
        expanded = self.capacity.num_expanded_blocks
        self.machine = ResidencyMachine(self.capacity) if cycle else None
        # The replay's pool is as large as the cycle's ever gets, from the start, the draft's KV beside it.
        pool = size.base_blocks if cycle else expanded
        self.reserve = make_reserve(size, expanded, pool)
        self.reserve.commit(pool, lend_draft_kv=False)
        self.alloc = Allocator(pool)
        self.target_kv = views(self.reserve, False, pool)
        self.draft_kv = views(self.reserve, True, pool)
        self.drafting = True  # the draft is resident and its KV complete
        self.running: list[Request] = []
        self.waiting: list[Request] = []
        self.done: list[Request] = []
        self.side = torch.cuda.Stream()
        self.reload: PendingReload | None = None

    # -- scheduling ---------------------------------------------------------------------------------------

    def admit(self, step: int, replay: dict[int, list[int]] | None) -> list[int]:
        """Admit waiting requests while every block they will ever take is free beside what the running ones
        still need (blocks are taken as the requests grow, lowest id first); a replay admits what the recorded
        run admitted at this step."""
        admitted = []
        while self.waiting:
            head = self.waiting[0]
            blocks = -(-len(head.prompt) // BLOCK)
            if replay is not None and head.rid not in replay.get(step, []):
                break
            if replay is None and self.num_free() < head.final_blocks:
                break
            self.waiting.pop(0)
            head.blocks = [self.alloc.take() for _ in range(blocks)]
            self.prefill(head)
            self.running.append(head)
            admitted.append(head.rid)
        return admitted

    def num_free(self) -> int:
        """Free blocks that no running request will still take: what the machine's triggers read."""
        return len(self.alloc.free) - sum(r.final_blocks - len(r.blocks) for r in self.running)

    def table(self, requests: list[Request]) -> torch.Tensor:
        rows = [r.blocks + [0] * (self.size.table_width - len(r.blocks)) for r in requests]
        return torch.tensor(rows, dtype=torch.long, device=DEVICE)

    @torch.no_grad()
    def prefill(self, request: Request) -> None:
        tokens = torch.tensor([request.prompt], device=DEVICE)
        starts = torch.zeros(1, dtype=torch.long, device=DEVICE)
        table = self.table([request])
        logits = self.target(tokens, starts, table, self.target_kv)
        if self.drafting:
            self.draft(tokens, starts, table, self.draft_kv)
        request.out.append(int(logits.argmax(-1)))

    @torch.no_grad()
    def step(self, index: int) -> dict:
        """One decode step for every running request: its next block if it needs one, the target's forward and
        the draft's, greedy choice, finished requests retired."""
        for r in self.running:
            if (len(r.tokens) - 1) // BLOCK >= len(r.blocks):  # the last token's position, written this step
                r.blocks.append(self.alloc.take())
        started = time.perf_counter()
        tokens = torch.tensor([[r.tokens[-1]] for r in self.running], device=DEVICE)
        starts = torch.tensor([len(r.tokens) - 1 for r in self.running], device=DEVICE)
        table = self.table(self.running)
        logits = self.target(tokens, starts, table, self.target_kv)
        drafting = self.drafting
        if drafting:
            proposals = self.draft(tokens, starts, table, self.draft_kv).argmax(-1).tolist()
            for r, token in zip(self.running, proposals, strict=True):
                r.drafted[index] = token
        chosen = logits.argmax(-1).tolist()  # the host sync that ends a step
        seconds = time.perf_counter() - started
        batch = len(self.running)
        for r, token in zip(self.running, chosen, strict=True):
            r.out.append(token)
        for r in [r for r in self.running if len(r.out) >= r.max_tokens]:
            self.running.remove(r)
            self.alloc.give(r.blocks)
            self.done.append(r)
        return {"batch": batch, "ms": seconds * 1e3, "draft_ran": drafting, "tokens": chosen}

    def k(self) -> int:
        """The stand-in policy: speculation off while the burst runs, and whenever the draft cannot draft."""
        return 0 if len(self.running) > self.size.long_requests or not self.drafting else 2

    # -- the residency machine and its actions ------------------------------------------------------------

    def observe(self, index: int) -> None:
        """After a step, as the scheduler does: a finished reload first, then the machine's triggers."""
        if self.machine is None or self.parked is None:
            return
        if (pending := self.reload) is not None and pending.end.query():
            self.reload = None
            self.emit(
                {
                    "kind": "event",
                    "name": "reload",
                    "seconds": time.perf_counter() - pending.issued_s,
                    "copy_seconds": pending.start.elapsed_time(pending.end) / 1e3,
                    "steps_during": index + 1 - pending.first_step,
                    "bytes": self.parked.num_bytes,
                }
            )
            self.apply(self.machine.reload_done(time.perf_counter()))
            self.catch_up(index + 1)
        pool = PoolView(self)
        obs = MemoryStep(
            now_s=time.perf_counter(),
            k=self.k(),
            num_waiting=len(self.waiting),
            num_kv_blocks_free=self.num_free(),
            num_live_extra_blocks=len(pool.live_extra_blocks()),
        )
        self.apply(self.machine.step(obs, pool), index + 1)

    def apply(self, actions: list, next_step: int = -1) -> None:
        machine, parked = self.machine, self.parked
        assert machine is not None and parked is not None, "only the cycle run acts"
        base, expanded = self.capacity.num_base_blocks, self.capacity.num_expanded_blocks
        for action in actions:
            free = driver_free()
            started = time.perf_counter()
            if isinstance(action, StartOffload):
                self.drafting = False
                given = parked.offload() + self.reserve.trim(base, lend_draft_kv=True)
                self.event("offload", started, free, reason=action.reason, bytes_given=given)
                self.apply(machine.offload_done(time.perf_counter()))
            elif isinstance(action, ExpandPool):
                mapped = self.reserve.commit(expanded, lend_draft_kv=True)
                self.target_kv = views(self.reserve, False, expanded)
                self.alloc.resize(expanded)
                self.event("expand", started, free, blocks=action.num_blocks, bytes_mapped=mapped)
            elif isinstance(action, StartContraction):
                moves = [(move.source, move.destination) for move in action.plan.moves]
                self.migrate(moves)
                self.alloc.resize(base)
                given = self.reserve.trim(base, lend_draft_kv=True)
                self.target_kv = views(self.reserve, False, base)
                mapped = self.reserve.commit(base, lend_draft_kv=False)  # the draft's KV pages again, zeroed
                self.event(
                    "contract",
                    started,
                    free,
                    reason=action.reason,
                    moved=len(moves),
                    bytes_given=given,
                    bytes_mapped=mapped,
                )
                self.apply(machine.contraction_done(time.perf_counter()), next_step)
            elif isinstance(action, StartReload):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(self.side)
                parked.reload(self.side)
                end.record(self.side)
                self.reload = PendingReload(start, end, started, next_step)
                # No wait: the copy runs on the side stream beside the next steps (a wait here had it finish
                # before them, and timed the copy as the host's pause).
                self.event("reload issued", started, free, wait=False, bytes=parked.num_bytes)

    def migrate(self, moves: list[tuple[int, int]]) -> None:
        """The plan's copies in every target layer, then the requests' block ids pointed at the destinations."""
        if not moves:
            return
        sources = torch.tensor([s for s, _ in moves], device=DEVICE)
        destinations = torch.tensor([d for _, d in moves], device=DEVICE)
        for cache in self.target_kv:
            cache[destinations] = cache[sources]
        remap = dict(moves)
        for r in self.running:
            r.blocks = [remap.get(block, block) for block in r.blocks]
        self.alloc.free -= set(remap.values())

    @torch.no_grad()
    def catch_up(self, first_step: int) -> None:
        """The draft's KV, zeroed while it was away, rebuilt over each running request's context but its last
        token (which the next step writes): one forward per request."""
        torch.cuda.synchronize()
        free = driver_free()
        started = time.perf_counter()
        tokens = 0
        for r in self.running:
            context = r.tokens[:-1]
            starts = torch.zeros(1, dtype=torch.long, device=DEVICE)
            self.draft(torch.tensor([context], device=DEVICE), starts, self.table([r]), self.draft_kv)
            tokens += len(context)
            r.drafted_from = first_step
        self.drafting = True
        self.event("catch-up", started, free, requests=len(self.running), tokens=tokens)

    def event(self, name: str, started: float, free_before: int, wait: bool = True, **fields: object) -> None:
        """An event's time; ``wait=False`` times the host's part only (what it queued on a stream still runs)."""
        if wait:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        self.emit(
            {
                "kind": "event",
                "name": name,
                "seconds": seconds,
                "free_before": free_before,
                "free_after": driver_free(wait),
                **fields,
            }
        )


def driver_free(wait: bool = True) -> int:
    """The driver's free bytes; mapping and unmapping are synchronous on the host, so no wait is needed to see
    them, only to let freed work finish."""
    if wait:
        torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def requests(size: Size) -> tuple[list[Request], list[Request]]:
    rng = torch.Generator().manual_seed(1)

    def make(rid: int, prompt: int, output: int) -> Request:
        length = int(torch.randint(prompt // 2, prompt + 1, (1,), generator=rng))  # block crossings spread out
        return Request(rid, torch.randint(4, VOCAB, (length,), generator=rng).tolist(), output)

    long = [make(i, size.long_prompt, size.long_output) for i in range(size.long_requests)]
    burst = [make(len(long) + i, size.burst_prompt, size.burst_output) for i in range(size.burst_requests)]
    return long, burst


def models(size: Size) -> tuple[Decoder, Decoder]:
    torch.manual_seed(0)
    target = Decoder(size.target_layers, size.target_hidden).to(DEVICE, DTYPE).eval()
    draft = Decoder(size.draft_layers, size.draft_hidden).to(DEVICE, DTYPE).eval()
    return target, draft


@torch.no_grad()
def warm_up(engine: Engine, size: Size) -> None:
    """Every activation shape the run will need, so the caching allocator holds its memory before the filler."""
    batch = size.long_requests + size.burst_requests
    table = torch.zeros(batch, size.table_width, dtype=torch.long, device=DEVICE)
    for model, caches in ((engine.target, engine.target_kv), (engine.draft, engine.draft_kv)):
        model(
            torch.ones(batch, 1, dtype=torch.long, device=DEVICE),
            torch.zeros(batch, dtype=torch.long, device=DEVICE),
            table,
            caches,
        )
        longest = size.long_prompt + size.long_output
        model(
            torch.ones(1, longest, dtype=torch.long, device=DEVICE),
            torch.zeros(1, dtype=torch.long, device=DEVICE),
            table[:1],
            caches,
        )
    for cache in (*engine.target_kv, *engine.draft_kv):
        cache[0].zero_()  # block 0 is the tables' padding: the same zeros in every run
    torch.cuda.synchronize()


def run(
    size: Size, cycle: bool, replay: dict[int, list[int]] | None, emit: Callable[[dict], None], headroom: int
) -> tuple[dict[int, Request], dict[int, list[int]]]:
    """One run; returns the requests by id and the admissions by step. The cycle run fills free memory to
    ``headroom`` bytes (negative: half the bytes the offload lends; 0: no filler)."""
    target, draft = models(size)
    engine = Engine(size, target, draft, cycle, emit)
    warm_up(engine, size)
    filler = None
    if cycle and headroom:
        headroom = engine.capacity.lent_bytes // 2 if headroom < 0 else headroom
        free = driver_free()
        filler = torch.empty(max(free - headroom, 0), dtype=torch.uint8, device=DEVICE)
    long, burst = requests(size)
    engine.waiting = list(long)
    emit(
        {
            "kind": "setup",
            "cycle": cycle,
            "size": size.__dict__,
            "draft_bytes": engine.capacity.draft_bytes,
            "base_blocks": engine.capacity.num_base_blocks,
            "expanded_blocks": engine.capacity.num_expanded_blocks,
            "target_bytes_per_block": engine.capacity.target_bytes_per_block,
            "free": driver_free(),
            "filler": 0 if filler is None else filler.numel(),
        }
    )
    admissions: dict[int, list[int]] = {}
    index = 0
    while engine.running or engine.waiting or index <= size.burst_at_step:
        if index == size.burst_at_step:
            engine.waiting += burst
        admitted = engine.admit(index, replay)
        if admitted:
            admissions[index] = admitted
        if engine.running:
            row = engine.step(index)
            state = engine.machine.state.value if engine.machine else "resident"
            emit(
                {
                    "kind": "step",
                    "cycle": cycle,
                    "step": index,
                    "state": state,
                    "k": engine.k(),
                    "free_blocks": engine.num_free(),
                    "pool_blocks": engine.alloc.limit,
                    **row,
                }
            )
            engine.observe(index)
        index += 1
    del filler
    engine.reserve.pages.close()  # type: ignore[union-attr]
    return {r.rid: r for r in engine.done}, admissions


def check(cycled: dict[int, Request], replayed: dict[int, Request]) -> dict:
    resumed = [r for r in cycled.values() if r.drafted_from >= 0]
    compared = agreed = 0
    for r in resumed:
        for step, token in r.drafted.items():
            if step >= r.drafted_from:
                compared += 1
                agreed += token == replayed[r.rid].drafted.get(step)
    return {
        "kind": "check",
        "requests": len(cycled),
        "target_tokens_identical": all(r.out == replayed[r.rid].out for r in cycled.values()),
        # request id -> the first output token that differs
        "requests_differing": {
            rid: next(i for i, (a, b) in enumerate(zip(r.out, replayed[rid].out, strict=True)) if a != b)
            for rid, r in cycled.items()
            if r.out != replayed[rid].out
        },
        "resumed_requests": len(resumed),
        "draft_steps_compared": compared,
        "draft_agreement": agreed / compared if compared else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--small", action="store_true", help="tiny models and pool: a quick check of the logic")
    parser.add_argument(
        "--replays",
        type=int,
        default=1,
        help="replays of the same admissions; from 2, each later one is compared with the first as well "
        "(is the engine deterministic on this GPU at all?)",
    )
    parser.add_argument(
        "--headroom-mb",
        type=int,
        default=-1,
        help="free memory left beside the run once warmed up (default: half the draft's bytes; 0: no filler)",
    )
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="torch's deterministic algorithms, cuBLAS's fixed workspace and the math attention kernel: without "
        "them two replays at the full size already differ on an H200 (step times then say nothing about speed)",
    )
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    args = parser.parse_args()
    global DTYPE
    DTYPE = getattr(torch, args.dtype)
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts, after this
        torch.use_deterministic_algorithms(True)
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_cudnn_sdp(False)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    size = SMALL if args.small else FULL
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as sink:

        def emit(row: dict) -> None:
            sink.write(json.dumps(row) + "\n")
            if row["kind"] != "step":
                print(json.dumps(row), file=sys.stderr, flush=True)

        emit(
            {
                "kind": "device",
                "name": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "dtype": args.dtype,
                "deterministic": args.deterministic,
            }
        )
        headroom = args.headroom_mb if args.headroom_mb <= 0 else args.headroom_mb << 20
        cycled, admissions = run(size, True, None, emit, headroom)
        torch.cuda.empty_cache()
        replayed, _ = run(size, False, admissions, emit, 0)
        result = check(cycled, replayed)
        emit(result)
        for _ in range(args.replays - 1):
            torch.cuda.empty_cache()
            again, _ = run(size, False, admissions, emit, 0)
            emit({**check(again, replayed), "kind": "check replay"})
    return 0 if result["target_tokens_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())

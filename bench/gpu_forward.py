"""Forward-pass times of Llama-shaped models on one GPU, torch only (no vLLM), for the simulator's profiles.

    python3 bench/gpu_forward.py --out results.jsonl [--models llama3.1-8b,llama3.2-1b] [--smoke]

Each model is built with random bf16 weights from its Hugging Face shape (below) and timed over a grid of
batch size B x query tokens per request q x cached context c per request: q = 1 is a decode step, q = k + 1
a verification of k drafts, and a few B = 1..4 points with c = 0 are prefill chunks. Every forward is what
a CUDA-graph engine runs per step: embedding, each layer (RMSNorm, QKV, rotary, attention over the cached
keys, O, RMSNorm, gated MLP), final norm and the LM head over every query token. Decode and verify points
are captured in a CUDA graph and replayed (as vLLM does up to its capture size); prefill points run eager.

Attention is PyTorch's SDPA over a dense per-request cache with grouped-query heads folded into the query
rows. It is not vLLM's paged split-KV kernel: at small batch and long context it leaves SMs idle, so the
context term it measures is an upper bound on vLLM's. The engine's own CPU work (scheduler, input
preparation, sampling) is not in these numbers; the simulator prices it separately (step_overhead_s).

Besides the grid, ``k0`` rows time a k = 0 decode step of each pair with and without one draft pass (the
pass vLLM 0.32 runs at runtime k = 0 to keep the draft's KV in step), both inside one CUDA graph.
One JSON object per line: {"kind": "forward"|"k0", "model"|"pair", "B", "q", "c", "ms", ...}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    # An EAGLE head: one layer fed by concat(hidden, token embedding) through an fc, sharing the target's
    # LM head (same vocab); it reads its own one-layer KV.
    eagle: bool = False


# From each model's Hugging Face config.json.
SHAPES = {
    "llama2-7b": Shape(32, 4096, 11008, 32, 32, 128, 32000),
    "llama-160m": Shape(12, 768, 3072, 12, 12, 64, 32000),
    "llama3.1-8b": Shape(32, 4096, 14336, 32, 8, 128, 128256),
    "llama3.2-1b": Shape(16, 2048, 8192, 32, 8, 64, 128256),
    "eagle-llama3.1-8b": Shape(1, 4096, 14336, 32, 8, 128, 128256, eagle=True),
    "vicuna-13b": Shape(40, 5120, 13824, 40, 40, 128, 32000),
}
PAIRS = {
    "llama2-7b+160m": ("llama2-7b", "llama-160m"),
    "llama3.1-8b+1b": ("llama3.1-8b", "llama3.2-1b"),
    "llama3.1-8b+eagle": ("llama3.1-8b", "eagle-llama3.1-8b"),
}
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
QUERIES = (1, 3, 5)
CONTEXTS = (256, 1024, 4096)
PREFILL = ((1, 128), (1, 512), (1, 2048), (1, 8192), (4, 512), (4, 2048))
# Cache bytes allowed per point: with the weights this stays inside an 80 GB H100.
KV_BUDGET_BYTES = 36 * 2**30


class Model:
    def __init__(self, shape: Shape, device: str, dtype: torch.dtype) -> None:
        self.s = shape
        g = torch.Generator(device=device).manual_seed(0)

        def w(*size: int) -> torch.Tensor:
            return torch.randn(*size, generator=g, device=device, dtype=dtype) * 0.02

        h, d = shape.hidden, shape.head_dim
        self.embed = w(shape.vocab, h)
        self.lm_head = w(shape.vocab, h)
        self.fc = w(h, 2 * h) if shape.eagle else None
        self.layers = [
            {
                "qkv": w((shape.heads + 2 * shape.kv_heads) * d, h),
                "o": w(h, shape.heads * d),
                "gate_up": w(2 * shape.intermediate, h),
                "down": w(h, shape.intermediate),
                "n1": torch.ones(h, device=device, dtype=dtype),
                "n2": torch.ones(h, device=device, dtype=dtype),
            }
            for _ in range(shape.layers)
        ]
        self.norm = torch.ones(h, device=device, dtype=dtype)

    def kv_bytes_per_token(self) -> int:
        return 2 * self.s.layers * self.s.kv_heads * self.s.head_dim * 2

    def cache(self, b: int, c: int, q: int, device: str, dtype: torch.dtype) -> list[torch.Tensor]:
        # [2, B, kv_heads, c + q, D] per layer: the new tokens' keys sit at the end, as after the cache write.
        return [
            torch.randn(2, b, self.s.kv_heads, c + q, self.s.head_dim, device=device, dtype=dtype)
            for _ in range(self.s.layers)
        ]

    def forward(self, tokens: torch.Tensor, kv: list[torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        s = self.s
        b, q = tokens.shape
        group = s.heads // s.kv_heads
        x = F.embedding(tokens, self.embed)
        if self.fc is not None:
            x = F.linear(torch.cat([x, x], dim=-1), self.fc)
        for layer, cache in zip(self.layers, kv, strict=True):
            r = x
            x = F.rms_norm(x, (s.hidden,), layer["n1"])
            qkv = F.linear(x, layer["qkv"])
            qh, kh, _ = qkv.split([s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], -1)
            # Rotary: the same elementwise work as vLLM's, on fixed angles.
            qh = qh * 0.5 + qh.roll(1, -1) * 0.5
            kh = kh * 0.5 + kh.roll(1, -1) * 0.5
            # Fold the query heads of one KV head into query rows: [B, kv_heads, group * q, D].
            qh = (
                qh.view(b, q, s.kv_heads, group, s.head_dim)
                .permute(0, 2, 3, 1, 4)
                .reshape(b, s.kv_heads, group * q, s.head_dim)
            )
            a = F.scaled_dot_product_attention(qh, cache[0], cache[1], attn_mask=mask)
            a = a.view(b, s.kv_heads, group, q, s.head_dim).permute(0, 3, 1, 2, 4).reshape(b, q, s.heads * s.head_dim)
            x = r + F.linear(a, layer["o"])
            r = x
            x = F.rms_norm(x, (s.hidden,), layer["n2"])
            gate, up = F.linear(x, layer["gate_up"]).chunk(2, -1)
            x = r + F.linear(F.silu(gate) * up, layer["down"])
            del kh
        x = F.rms_norm(x, (s.hidden,), self.norm)
        return F.linear(x, self.lm_head)


def lower_right_mask(q: int, c: int, group: int, device: str) -> torch.Tensor | None:
    if q == 1:
        return None
    rows = torch.arange(q, device=device).repeat(group)[:, None]
    cols = torch.arange(c + q, device=device)[None, :]
    return cols <= rows + c


def time_fn(fn, reps: int, graph: bool) -> float:
    """Median milliseconds of ``fn``, replayed from a CUDA graph when ``graph``."""
    if torch.cuda.is_available():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        run = fn
        if graph:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            run = g.replay
        for _ in range(3):
            run()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for st, en in zip(starts, ends, strict=True):
            st.record()
            run()
            en.record()
        torch.cuda.synchronize()
        times = sorted(st.elapsed_time(en) for st, en in zip(starts, ends, strict=True))
    else:
        fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        times.sort()
    return times[len(times) // 2]


def time_k0_step(
    target: Model, draft: Model, b: int, c: int, reps: int, device: str, dtype: torch.dtype
) -> tuple[float, float]:
    """A k = 0 decode step's milliseconds: the target alone, then the target and one draft pass."""
    tkv, dkv = target.cache(b, c, 1, device, dtype), draft.cache(b, c, 1, device, dtype)
    tokens = torch.randint(0, min(target.s.vocab, draft.s.vocab), (b, 1), device=device)
    alone = time_fn(lambda: target.forward(tokens, tkv, None), reps, True)
    both = time_fn(lambda: (target.forward(tokens, tkv, None), draft.forward(tokens, dkv, None)), reps, True)
    return alone, both


def grid(model: Model, smoke: bool) -> list[tuple[int, int, int]]:
    if smoke:
        return [(1, 1, 64), (2, 3, 64), (1, 32, 0)]
    points = [(b, q, c) for b in BATCHES for q in QUERIES for c in CONTEXTS]
    points = [p for p in points if p[0] * (p[2] + p[1]) * model.kv_bytes_per_token() <= KV_BUDGET_BYTES]
    return points + [(b, q, 0) for b, q in PREFILL]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default=",".join(SHAPES))
    parser.add_argument("--pairs", default=",".join(PAIRS))
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="a 2-layer toy of each model, three points")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    shapes = dict(SHAPES)
    if args.smoke:
        shapes = {
            n: Shape(min(s.layers, 2), 256, 512, 4, 2 if s.kv_heads < s.heads else 4, 64, 1000, s.eagle)
            for n, s in shapes.items()
        }
    with open(args.out, "w") as out, torch.inference_mode():

        def emit(row: dict) -> None:
            row["gpu"] = gpu
            out.write(json.dumps(row) + "\n")
            out.flush()

        for name in args.models.split(","):
            t0 = time.time()
            model = Model(shapes[name], device, dtype)
            points = grid(model, args.smoke)
            for b, q, c in points:
                kv = model.cache(b, c, q, device, dtype)
                tokens = torch.randint(0, model.s.vocab, (b, q), device=device)
                mask = lower_right_mask(q, c, model.s.heads // model.s.kv_heads, device)
                graph = c > 0 and b * q <= 2048
                ms = time_fn(lambda m=model, t=tokens, k=kv, mk=mask: m.forward(t, k, mk), args.reps, graph)
                emit({"kind": "forward", "model": name, "B": b, "q": q, "c": c, "ms": ms, "graph": graph})
                del kv
            print(f"{name}: {len(points)} points in {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
            del model
            if device == "cuda":
                torch.cuda.empty_cache()
        for pair in args.pairs.split(","):
            t_name, d_name = PAIRS[pair]
            target, draft = Model(shapes[t_name], device, dtype), Model(shapes[d_name], device, dtype)
            for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if not args.smoke else (1, 2):
                c = 1024 if not args.smoke else 64
                if b * (c + 1) * target.kv_bytes_per_token() > KV_BUDGET_BYTES:
                    continue
                alone, both = time_k0_step(target, draft, b, c, args.reps, device, dtype)
                emit({"kind": "k0", "pair": pair, "B": b, "q": 1, "c": c, "ms_target": alone, "ms_with_draft": both})
            print(f"{pair}: k0 done", file=sys.stderr, flush=True)
            del target, draft
            if device == "cuda":
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

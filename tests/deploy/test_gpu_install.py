"""The install line a Ray Serve LLM user on GPU nodes runs (docs/gpu-cluster.md): `pip install "specserve[gpu]"`
resolves for Linux x86-64 against the package registry to Ray 2.60 with vLLM 0.32 (CUDA torch), and adding
`ray[llm]` cannot resolve, as the page says. uv resolves from the packages' metadata (a few seconds, about 90 MB of
wheels on a cold cache) without installing a GPU wheel on this CPU machine."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UV = Path(sys.executable).parent / "uv"


def resolve(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    inputs = [str(ROOT / "pyproject.toml")]
    if extra:
        (tmp_path / "extra.in").write_text("\n".join(extra) + "\n")
        inputs.append(str(tmp_path / "extra.in"))
    return subprocess.run(
        [
            str(UV), "pip", "compile", *inputs, "--extra", "gpu", "--python-platform", "x86_64-manylinux_2_28",
            "--python-version", "3.11", "--no-header", "--no-config", "--quiet", "-o", str(tmp_path / "out.txt"),
        ],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip


def test_the_gpu_extra_resolves_to_ray_260_and_vllm_032_with_cuda_torch(tmp_path):
    done = resolve(tmp_path)
    assert done.returncode == 0, done.stderr
    pins = dict(re.findall(r"^([a-z0-9_.-]+)==(\S+)", (tmp_path / "out.txt").read_text(), re.M))
    assert (pins["ray"], pins["vllm"]) == ("2.60.0", "0.32.0")
    assert "+cpu" not in pins["torch"], "the GPU build of torch, as vllm==0.32.0 pins it"


def test_ray_llm_cannot_join_it_because_it_pins_vllm_029(tmp_path):
    done = resolve(tmp_path, "ray[llm]==2.60.0")
    assert done.returncode != 0
    assert "vllm[audio]==0.29.0" in done.stderr

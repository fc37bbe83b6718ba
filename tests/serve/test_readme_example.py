"""The README's Python API example (examples/ray_serve_llm.py, shown there verbatim) runs as written: it deploys with
serve.run on a local Ray cluster it starts, gets an OpenAI completion over HTTP, and leaves no process behind."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from serve_process import free_port, processes_under

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "ray_serve_llm.py"


def test_the_readme_shows_the_example_verbatim() -> None:
    readme = (REPO / "README.md").read_text()
    assert f"```python\n{EXAMPLE.read_text()}```\n" in readme


def test_the_example_answers_a_completion_starts_the_controller_and_cleans_up(trained_pair) -> None:
    # Ray's temporary folder (TMPDIR) is this test's own: its processes name it, which finds every one left behind.
    # Short, under /tmp: Ray's socket paths inside it must stay under the 107-byte AF_UNIX limit.
    scratch = Path(tempfile.mkdtemp(prefix="ss-example-", dir="/tmp"))
    env = dict(os.environ, TMPDIR=str(scratch), PYTHONPATH=str(REPO))
    env.pop("RAY_ADDRESS", None)
    code = (
        f"import sys; sys.path.insert(0, {str(EXAMPLE.parent)!r}); import ray_serve_llm; "
        f"print('COMPLETION', repr(ray_serve_llm.main(port={free_port()}))); "
        # The replica started the cluster's controller (named, detached), which `specserve status` asks.
        "import ray; from specserve.messages import CONTROLLER_NAME, CONTROLLER_NAMESPACE; "
        "print('CONTROLLER', ray.get_actor(CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE) is not None)"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=scratch, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-4000:]
        line = next(line for line in done.stdout.splitlines() if line.startswith("COMPLETION "))
        assert ast.literal_eval(line.removeprefix("COMPLETION ")), "the model wrote nothing"
        assert "CONTROLLER True" in done.stdout.splitlines()
        assert not processes_under(scratch), "the example's Ray cluster stops with it"
    finally:
        for process in processes_under(scratch):
            process.kill()
        shutil.rmtree(scratch, ignore_errors=True)

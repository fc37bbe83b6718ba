"""Serve tier: each method besides the draft model (n-gram lookup, an EAGLE-3 head, an MTP layer) served through HTTP
with prefix caching on: greedy answers identical to plain decoding (fixed:k=0) under fixed:k=max, a cycle of k = 0
stretches and resumptions, and adaptive; `status` names the method and what its k = 0 does.

The draft model's served identity with prefix caching is the default path's, covered by the endpoint tier.
"""

from __future__ import annotations

import pytest
from openai import OpenAI
from serve_process import API_KEY, free_port, serving, specserve_cli, wait_for_replica

from specserve.models.prompts import OPENINGS
from specserve.speculation.methods import method

MODEL = "specserve-tiny"
# Longer than one of the CPU build's 128-token KV blocks, so that later requests start at a prefix-cache hit.
SHARED = "\n".join(OPENINGS[:5]) * 3
PROMPTS = [SHARED + OPENINGS[i] for i in range(5, 8)] + ["".join([OPENINGS[1]] * 4)]
CYCLE = "cycle:ks=4-4-0-0-0-0-0-4-4-4"


def answers(client: OpenAI) -> list[str]:
    return [
        client.completions.create(model=MODEL, prompt=p, max_tokens=32, temperature=0).choices[0].text for p in PROMPTS
    ]


# n-gram over HTTP is `make test-slow`'s (CI's 45 minutes): the engine tier runs it under every policy with the same
# hooks, and what HTTP adds does not depend on the method.
@pytest.mark.parametrize("name", [pytest.param("ngram", marks=pytest.mark.slow), "eagle3", "mtp"])
def test_a_method_serves_plain_decodings_answers_under_every_policy(tmp_path, trained_pair, name):
    config = tmp_path / "serve.yaml"
    # A speculative setting of vLLM's own rides along with specserve's (a harmless one: the draft's TP as the target's).
    config.write_text(
        "engine_kwargs:\n  enable_prefix_caching: true\n  speculative_config: {draft_tensor_parallel_size: 1}\n"
        f"speculation:\n  method: {name}\n  policy: fixed:k=0\n"
    )
    args = ["--port", str(free_port()), "--metrics-port", str(free_port()), "--config", str(config)]
    with serving(args, tmp_path, SPECSERVE_API_KEY=API_KEY) as server:
        replica = wait_for_replica(server)
        assert replica["engine"]["method"] == name
        assert replica["engine"]["k0"] == method(name).k0.value
        client = OpenAI(base_url=server.endpoint, api_key=API_KEY)
        plain = answers(client)
        for policy in ("fixed:k=4", CYCLE, "adaptive"):
            assert specserve_cli(server.env, "policy", "set", policy).returncode == 0
            wait_for_replica(server, until=lambda r, p=policy: r["engine"]["policy"].startswith(p.split(":")[0]))
            assert answers(client) == plain, f"{name} under {policy}"
        engine = wait_for_replica(server)["engine"]
        assert sum(engine["num_drafted_per_pos"]) > 0 and sum(engine["num_accepted_per_pos"]) > 0, engine

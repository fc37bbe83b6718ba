"""An existing Ray Serve LLM deployment with specserve's adaptive speculative decoding added.

Runs on a CPU with the bundled tiny model pair; on GPUs, name your own models and drop the CPU line.
"""

import json
import urllib.request

from ray import serve
from ray.serve.llm import LLMConfig, build_openai_app

from specserve import speculative_llm_config
from specserve.models import cached_pair


def main(port: int = 8000) -> str:
    pair = cached_pair("trained")  # the tiny target/draft pair: built once (2-8 minutes), then cached
    llm_config = LLMConfig(
        model_loading_config={"model_id": "specserve-tiny", "model_source": str(pair.target)},
        accelerator_config={"kind": "cpu"},  # on GPUs: accelerator_type="H100" (or leave both out)
        engine_kwargs={"max_model_len": 512, "max_num_seqs": 8},
    )
    # The one added line: specserve's replica class, engine arguments and policy.
    llm_config = speculative_llm_config(llm_config, draft=str(pair.draft), policy="adaptive", max_k=4)

    serve.start(http_options={"host": "127.0.0.1", "port": port})
    # The ingress only routes requests; without a CPU of its own it fits beside the engine on a 2-core machine.
    app = build_openai_app(
        {"llm_configs": [llm_config], "ingress_deployment_config": {"ray_actor_options": {"num_cpus": 0}}}
    )
    serve.run(app, blocking=False)
    body = {"model": "specserve-tiny", "prompt": "def main():\n", "max_tokens": 16, "temperature": 0}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        text = json.load(response)["choices"][0]["text"]
    serve.shutdown()
    return text


if __name__ == "__main__":
    print(main())

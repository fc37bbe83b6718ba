"""An existing Ray Serve LLM deployment with specserve's adaptive speculative decoding added.

Runs on a CPU with the bundled tiny model pair; on GPUs, name your own models and drop the CPU line.
"""

import json
import urllib.request

from ray import serve
from ray.serve.llm import LLMConfig

from specserve import build_openai_app, speculative_llm_config
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
    # Ray Serve LLM's build_openai_app with specserve's ingress in front (OpenAI errors, API key, overload answers).
    # The replica starts the cluster's controller, so `specserve status` and `policy set` work as with `serve`.
    serve.run(build_openai_app([llm_config]), blocking=False)
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

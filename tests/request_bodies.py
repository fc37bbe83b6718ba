"""Hypothesis strategies of OpenAI request bodies: valid ones with some fields set to other JSON (wrong types,
integers past 64 bits, NaN and infinities, unicode, nested objects) or required fields left out. Used against
the ingress's layer in-process (tests/unit/test_ingress.py) and against a live serve
(tests/serve/endpoint/test_robustness_and_key.py).
"""

from __future__ import annotations

from hypothesis import strategies as st

MODEL = "specserve-tiny"

# Values of every JSON type, the edges vLLM and torch trip on among them.
ANY_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([2**31, 2**63, 2**64, -(2**63) - 1, -1, 0])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
# Fields of both endpoints that reach vLLM's sampling parameters or the tokenizer.
SHARED = [
    "model",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "seed",
    "stop",
    "stop_token_ids",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
    "stream",
    "stream_options",
    "response_format",
    "allowed_token_ids",
    "prompt_logprobs",
    "truncate_prompt_tokens",
    "priority",
    "user",
    "ignore_eos",
    "skip_special_tokens",
    "logprobs",
    "max_tokens",
]
COMPLETION_FIELDS = [*SHARED, "prompt", "echo", "best_of", "suffix"]
CHAT_FIELDS = [
    *SHARED,
    "messages",
    "top_logprobs",
    "max_completion_tokens",
    "tools",
    "tool_choice",
    "chat_template",
    "chat_template_kwargs",
    "add_generation_prompt",
]
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "nobody"]) | ANY_JSON},
    optional={"content": st.text(max_size=30) | ANY_JSON, "name": ANY_JSON, "tool_calls": ANY_JSON},
)


def mutated(base: dict, fields: list[str], extra: dict[str, st.SearchStrategy]) -> st.SearchStrategy[dict]:
    """A valid body with some fields set to other values (any JSON, or the field's own bad shapes), some required
    fields dropped. max_tokens stays small unless set to a bad value: a valid body then generates a few tokens."""

    @st.composite
    def build(draw: st.DrawFn) -> dict:
        body = dict(base)
        for name in draw(st.lists(st.sampled_from(fields), min_size=1, max_size=3, unique=True)):
            body[name] = draw(extra.get(name, ANY_JSON) | ANY_JSON)
        for name in ("max_tokens", "max_completion_tokens"):
            # null max_tokens means "the rest of the context": hundreds of tokens per body on a CPU.
            if (isinstance(body.get(name), int) and 4 < body[name] < 512) or (
                name == "max_tokens" and body[name] is None
            ):
                body[name] = 4
        for name in draw(st.lists(st.sampled_from(["model", "prompt", "messages"]), max_size=1)):
            body.pop(name, None)
        return body

    return build()


COMPLETION_BODIES = mutated(
    {"model": MODEL, "prompt": "def f(", "max_tokens": 2},
    COMPLETION_FIELDS,
    {"prompt": st.lists(st.integers(min_value=-5, max_value=2**40), max_size=4) | st.text(max_size=40)},
)
CHAT_BODIES = mutated(
    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    CHAT_FIELDS,
    {"messages": st.lists(MESSAGE, max_size=3) | MESSAGE},
)

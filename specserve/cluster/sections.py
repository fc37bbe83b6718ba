"""The sections specserve adds to Ray Serve LLM's ``LLMConfig``: ``speculation``, ``cpu`` and ``server``.

One model per section, used by the config file (``cluster/config.py``), the command line's shorthands and the public
Python API (``specserve.llm``) alike, so that a key has one name and one check everywhere. No Ray or vLLM import.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

# The speculation and cpu sections are the public API's own options (``specserve.llm``, which imports nothing of the
# cluster side); the config file and the CLI read them from here with the server section.
from specserve.llm import METHODS, CpuEngine, Speculation, check_engine_cpus, check_speculation

__all__ = ["METHODS", "CpuEngine", "ServerOptions", "Speculation", "check_engine_cpus", "check_speculation"]


class ServerOptions(BaseModel):
    """The `specserve serve` process and its local cluster: the ``server:`` section. A Serve config file sets these
    in Serve's own keys (``http_options``, ``proxy_location``) and in ``ray start``'s flags and environment."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    host: str = Field("127.0.0.1", description="Address the HTTP ingress binds.")
    port: int = Field(8000, ge=1, le=65535, description="Port of the OpenAI-compatible HTTP endpoint.")
    api_key: SecretStr | None = Field(
        None,
        description="Bearer token every request must carry (`Authorization: Bearer KEY`); default: none, the "
        "endpoint is open. Prefer SPECSERVE_API_KEY in the environment, which no file or `ps` shows.",
    )
    proxy_location: Literal["EveryNode", "HeadOnly"] = Field(
        "EveryNode",
        description="Where Ray Serve runs HTTP proxies: on every node (Serve's default, for a load balancer in front) "
        "or on the head only. A new Serve instance only: a cluster already running Serve keeps its proxies.",
    )
    throughput_optimized: bool = Field(
        False,
        description="Ray Serve's throughput-optimized mode on the local cluster (RAY_SERVE_THROUGHPUT_OPTIMIZED=1). "
        "A joined cluster takes it from the environment its nodes were started with.",
    )
    haproxy: bool = Field(
        False,
        description="Ray Serve's HAProxy ingress on the local cluster (RAY_SERVE_ENABLE_HA_PROXY=1). A joined cluster "
        "takes it from its nodes' environment.",
    )
    metrics_port: int = Field(
        8080, ge=1, le=65535, description="Ray's Prometheus metrics export port (local cluster only)."
    )
    prometheus_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Start a Prometheus (Debian's `prometheus`) on this port, scraping the local cluster's metrics "
        "port, its data in serve's temporary folder. Local cluster only; default: none.",
    )
    num_cpus: int | None = Field(
        None, ge=1, description="CPUs of the local Ray cluster. Default: this machine's, at least what engines need."
    )
    overload_status: Literal[429, 503] = Field(503, description="HTTP status of a request refused as overload.")
    retry_after_s: float = Field(
        1.0,
        ge=0,
        allow_inf_nan=False,
        description="Retry-After, seconds, of a request refused as overload or whose engine died.",
    )
    engine_start_timeout_s: float = Field(600.0, gt=0, description="How long `serve` waits for the endpoint to answer.")

    @field_validator("api_key")
    @classmethod
    def _key_is_a_token(cls, key: SecretStr | None) -> SecretStr | None:
        # The message never holds the key: it is printed.
        if key is not None:
            value = key.get_secret_value()
            if not value or any(c.isspace() or not c.isprintable() for c in value):
                raise ValueError("must be a non-empty token without spaces or control characters")
        return key

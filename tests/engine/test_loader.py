"""The loader converts the bundled GGUF once (also when loaded twice at once), caches float weights,
and reloads from the cache."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from engine.model import loader
from normalize.model_files import ModelSource, resolve_model

torch.set_num_threads(2)

MODEL = "smollm2-135m"


def test_config_of_bundled_model_without_loading_weights() -> None:
    config = loader.load_hf_config(MODEL)
    assert config["model_type"] == "llama"
    assert (config["num_hidden_layers"], config["num_key_value_heads"], config["head_dim"]) == (30, 3, 64)


@pytest.mark.slow
def test_gguf_converted_once_then_loaded_from_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVGATE_CACHE", str(tmp_path))
    config_from_gguf = loader.load_hf_config(MODEL)
    conversions = []
    convert = loader._convert_gguf

    def counted(source: ModelSource, target: Path) -> None:
        conversions.append(target)
        convert(source, target)

    monkeypatch.setattr(loader, "_convert_gguf", counted)
    with ThreadPoolExecutor(2) as pool:
        converted, at_once = pool.map(lambda _: loader.load_model(MODEL), range(2))
    assert len(conversions) == 1, "two loads at once (engines starting on one host) convert once"
    assert converted.weights.keys() == at_once.weights.keys()
    folder = resolve_model(MODEL).cache_dir / "hf"
    assert folder.parent.parent == tmp_path
    assert sorted(path.name for path in folder.iterdir()) == ["config.json", "model.safetensors"]
    assert [path.name for path in folder.parent.iterdir() if "partial" in path.name] == []

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("converted again instead of reading the cache")

    monkeypatch.setattr(loader, "_convert_gguf", refuse)
    reloaded = loader.load_model(MODEL)
    assert reloaded.config.to_dict()["num_hidden_layers"] == 30
    assert converted.weights.keys() == reloaded.weights.keys()
    for name, tensor in converted.weights.items():
        assert torch.equal(tensor, reloaded.weights[name]), name
    config_from_cache = loader.load_hf_config(MODEL)
    for config in (config_from_gguf, config_from_cache):
        del config["_name_or_path"]
    assert config_from_cache == config_from_gguf


def test_hf_folder_without_weights_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(FileNotFoundError, match="safetensors"):
        loader.load_model(str(tmp_path))

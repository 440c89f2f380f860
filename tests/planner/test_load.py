"""Finding a model's architecture: presets by name or source id, GGUF metadata, bundled model."""

from pathlib import Path

import gguf
import numpy as np
import pytest

from normalize.model_files import resolve_model
from planner.config_fields import ConfigFieldError
from planner.load import arch_from_source, load_arch, preset_names


def test_every_preset_loads_and_cites_its_source() -> None:
    assert len(preset_names()) >= 10
    for name in preset_names():
        assert "/" in load_arch(name).name


def test_presets_match_name_or_source_id_in_any_case() -> None:
    assert load_arch("LLAMA-2-7B") == load_arch("meta-llama/llama-2-7b-hf")


def test_bundled_gguf_agrees_with_the_smollm2_preset() -> None:
    from_gguf = arch_from_source(resolve_model("smollm2-135m"))
    preset = load_arch("smollm2-135m")
    assert from_gguf.layer_windows == preset.layer_windows
    assert (from_gguf.num_layers, from_gguf.num_kv_heads, from_gguf.head_dim, from_gguf.max_context) == (
        30,
        3,
        64,
        8192,
    )
    assert from_gguf.param_count == preset.param_count


def test_gguf_missing_metadata_names_the_keys(tmp_path: Path) -> None:
    path = tmp_path / "partial.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_context_length(128)
    writer.add_embedding_length(64)
    writer.add_tensor("token_embd.weight", np.zeros((10, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ConfigFieldError, match="is missing llama.attention.head_count$"):
        load_arch(str(path))


def test_gguf_without_feed_forward_length_plans_kv_without_weights(tmp_path: Path) -> None:
    path = tmp_path / "no-ffn.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_context_length(128)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_vocab_size(10)
    writer.add_tensor("token_embd.weight", np.zeros((10, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    arch = load_arch(str(path))
    assert (arch.num_layers, arch.num_kv_heads, arch.head_dim) == (2, 2, 16)
    assert arch.params is None
    assert arch.params_missing is not None and "'intermediate_size'" in arch.params_missing

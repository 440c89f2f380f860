"""The bundled model saved as a plain HF folder for vLLM: the same weights and tokenizer, no quantization."""

from pathlib import Path

import orjson
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from bench.peers.hf_export import export_hf_folder
from engine.model.loader import load_model
from normalize.model_files import resolve_model, tokenizer_dir

MODEL = "smollm2-135m"


@pytest.mark.slow
def test_export_is_a_plain_llama_folder_with_the_engines_weights_and_tokenizer(tmp_path: Path) -> None:
    target = export_hf_folder(MODEL, tmp_path / "hf", torch.bfloat16)

    config = orjson.loads((target / "config.json").read_bytes())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["dtype"] == "bfloat16"
    assert "quantization_config" not in config

    exported = load_file(target / "model.safetensors")
    source = load_model(MODEL).weights
    assert exported.keys() == source.keys()
    for name, tensor in source.items():
        assert torch.equal(exported[name], tensor.to(torch.bfloat16)), name

    reference = AutoTokenizer.from_pretrained(tokenizer_dir(resolve_model(MODEL)))
    tokenizer = AutoTokenizer.from_pretrained(target)
    text = "The capital of France is Paris.\n  Indented, émigré, 12345."
    assert tokenizer(text).input_ids == reference(text).input_ids
    messages = [{"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == reference.apply_chat_template(
        messages, tokenize=False
    )

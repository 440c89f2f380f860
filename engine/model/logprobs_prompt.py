"""Prompt logprobs: each prompt token's log-probability given the tokens before it.

The forward runs over a scratch paged cache of its own, as embeddings do (``engine.model.pooling``):
every position of the prompt needs its logits, and positions served from the prefix cache were
never computed for this request, so a prompt-logprob request recomputes its whole prompt and
neither reads nor fills the engine's prefix cache (vLLM likewise skips the prefix cache for
requests with ``prompt_logprobs``). Logits are taken a slice of rows at a time, so a long
prompt never holds a ``[prompt, vocab]`` float32 matrix at once.
"""

import torch

from engine.model.llama import LlamaForPagedLM
from engine.model.lora_batch import LoRABatch
from engine.model.pooling import scratch_hidden_states
from engine.model.runner_api import TokenLogprobs

_LOGIT_ROWS = 256
"""Prompt positions whose logits are computed at once (256 x 49k float32 is about 50 MB)."""


def prompt_logprobs(
    model: LlamaForPagedLM,
    token_ids: list[int],
    top: int,
    block_size: int,
    device: torch.device,
    lora: LoRABatch | None = None,
) -> list[TokenLogprobs | None]:
    """Per prompt position: None for the first token (nothing precedes it), else the token's
    logprob, its rank (1 = most likely) and the ``top`` most likely tokens there."""
    hidden = scratch_hidden_states(model, token_ids, block_size, device, lora)
    ids = torch.tensor(token_ids, device=hidden.device)
    found: list[TokenLogprobs | None] = [None]
    for start in range(0, len(token_ids) - 1, _LOGIT_ROWS):
        end = min(start + _LOGIT_ROWS, len(token_ids) - 1)
        logprobs = model.logits(hidden[start:end]).log_softmax(dim=-1)
        found.extend(_rows(logprobs, ids[start + 1 : end + 1], top))
    return found


def _rows(logprobs: torch.Tensor, next_ids: torch.Tensor, top: int) -> list[TokenLogprobs]:
    """Row i: the logprob and rank of ``next_ids[i]`` under ``logprobs[i]``, and its ``top`` best."""
    chosen = logprobs.gather(-1, next_ids[:, None])
    ranks = (logprobs > chosen).sum(dim=-1) + 1
    best_values, best_ids = logprobs.topk(top, dim=-1) if top else (logprobs[:, :0], logprobs[:, :0].long())
    return [
        TokenLogprobs(token, logprob, list(zip(ids, values, strict=True)), rank)
        for token, logprob, rank, ids, values in zip(
            next_ids.tolist(),
            chosen[:, 0].tolist(),
            ranks.tolist(),
            best_ids.tolist(),
            best_values.tolist(),
            strict=True,
        )
    ]

"""Pick the next token of each sequence from its logits: greedy, or temperature / top-k / top-p.

Before the pick, rows with OpenAI penalties or a ``logit_bias`` get their logits adjusted as vLLM
does: ``- frequency_penalty * count - presence_penalty * (count > 0)`` over the tokens generated
so far, then ``+ bias``. Rows without them are untouched, so plain greedy stays token-identical
to transformers.

Random draws use the exponential race (``argmax(probs / q)`` with ``q ~ Exp(1)``), which picks token
``i`` with probability ``probs[i]``. A seeded sequence draws ``q`` from a generator seeded by
``(seed, num_generated)``, so a sequence that is preempted and recomputed samples the same tokens
without the runner keeping any per-sequence state.
"""

import numpy as np
import numpy.typing as npt
import torch

from engine.model.runner_api import SamplingParams, SeqChunk, TokenLogprobs

GREEDY_BELOW = 1e-5
"""Temperatures below this sample greedily, as vLLM's do: dividing logits by ~1e-300 overflows to NaN."""
_SEED_STRIDE = 0x9E3779B97F4A7C15
_SEED_MASK = (1 << 63) - 1


def step_seed(seed: int, num_generated: int) -> int:
    """A generator seed per (request seed, step), spread so nearby steps are unrelated."""
    return (seed * _SEED_STRIDE + num_generated * 0xBF58476D1CE4E5B9) & _SEED_MASK


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set logits outside each row's top-k and top-p nucleus to -inf (``top_k`` 0 = no cut)."""
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    vocab = logits.shape[-1]
    k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab)
    kth_largest = sorted_logits.gather(-1, (vocab - k)[:, None])
    sorted_logits.masked_fill_(sorted_logits < kth_largest, float("-inf"))
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    outside_nucleus = cumulative <= (1 - top_p)[:, None]
    outside_nucleus[:, -1] = False
    sorted_logits.masked_fill_(outside_nucleus, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def apply_penalties(logits: torch.Tensor, chunks: list[SeqChunk]) -> torch.Tensor:
    """A copy of ``logits`` with each penalized row's penalties and logit bias applied."""
    rows = [row for row, chunk in enumerate(chunks) if chunk.sampling.penalized]
    if not rows:
        return logits
    logits = logits.clone()
    for row in rows:
        params = chunks[row].sampling
        outputs = chunks[row].output_token_ids
        if outputs and (params.presence_penalty or params.frequency_penalty):
            counts = torch.bincount(torch.tensor(outputs, device=logits.device), minlength=logits.shape[-1])
            counts = counts[: logits.shape[-1]].to(logits.dtype)
            logits[row] -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(logits.dtype)
        if params.logit_bias:
            ids = torch.tensor(list(params.logit_bias), device=logits.device)
            bias = torch.tensor(list(params.logit_bias.values()), dtype=logits.dtype, device=logits.device)
            logits[row].index_add_(0, ids, bias)
    return logits


def apply_token_bitmask(logits: torch.Tensor, rows: list[int], bitmask: npt.NDArray[np.int32]) -> torch.Tensor:
    """``logits`` with every token a grammar forbids set to -inf in the given rows.

    ``bitmask`` is ``[len(rows), ceil(vocab / 32)]`` int32, bit ``i`` of word ``j`` allowing token
    ``32 j + i`` (llguidance's layout: little-endian words, so numpy unpacks it in token order);
    logits past the mask's vocabulary are forbidden too."""
    vocab = logits.shape[-1]
    bits = np.unpackbits(np.ascontiguousarray(bitmask).view(np.uint8), axis=1, bitorder="little")[:, :vocab]
    if bits.shape[1] < vocab:
        bits = np.pad(bits, ((0, 0), (0, vocab - bits.shape[1])))
    # numpy, not torch's masked_fill: one thread, and about 20x faster on a CPU whose cores are busy
    bias = np.where(bits, np.float32(0), np.float32(-np.inf))
    logits = logits.clone()
    logits[torch.tensor(rows, device=logits.device)] += torch.from_numpy(bias).to(logits.device)
    return logits


def token_logprobs(raw_logits: torch.Tensor, tokens: list[int], top: list[int]) -> list[TokenLogprobs]:
    """Per row: the logprob of ``tokens[row]`` and the ``top[row]`` most likely tokens."""
    logprobs = raw_logits.log_softmax(dim=-1)
    chosen = logprobs.gather(-1, torch.tensor(tokens, device=logprobs.device)[:, None])[:, 0].tolist()
    most = max(top, default=0)
    best_values, best_ids = logprobs.topk(most, dim=-1) if most else (logprobs[:, :0], logprobs[:, :0].long())
    result = []
    for row, (token, k) in enumerate(zip(tokens, top, strict=True)):
        alternatives = list(zip(best_ids[row, :k].tolist(), best_values[row, :k].tolist(), strict=True))
        result.append(TokenLogprobs(token, chosen[row], alternatives))
    return result


class Sampler:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __call__(self, logits: torch.Tensor, params: list[SamplingParams], num_generated: list[int]) -> list[int]:
        """One token per row of ``logits`` ``[rows, vocab]`` (float32, penalties already applied)."""
        tokens = logits.argmax(dim=-1)
        sampled = [row for row, p in enumerate(params) if not p.greedy and p.temperature >= GREEDY_BELOW]
        if sampled:
            rows = torch.tensor(sampled, device=self.device)
            chosen = [params[row] for row in sampled]
            tokens[rows] = self._draw(logits[rows], chosen, [num_generated[row] for row in sampled])
        return tokens.tolist()

    def _draw(self, logits: torch.Tensor, params: list[SamplingParams], num_generated: list[int]) -> torch.Tensor:
        temperature = torch.tensor([p.temperature for p in params], device=self.device)
        logits = logits / temperature[:, None]
        if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
            top_k = torch.tensor([p.top_k for p in params], device=self.device)
            top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=self.device)
            logits = apply_top_k_top_p(logits, top_k, top_p)
        probs = logits.softmax(dim=-1)
        noise = torch.empty_like(probs)
        for row, (p, step) in enumerate(zip(params, num_generated, strict=False)):
            generator = None
            if p.seed is not None:
                generator = torch.Generator(device=self.device).manual_seed(step_seed(p.seed, step))
            noise[row].exponential_(generator=generator)
        return (probs / noise).argmax(dim=-1)

"""Gateway CPU per request for normalize + template + tokenize + block hashes.

Warm: a ~4,096-token chat prompt whose system prompt was seen before (only the user turn is
new). Cold: every system prompt new, compared with the tokenizer's own cost for the same text.
Long: ``--long-tokens`` distinct prompts of that many tokens (prose, and random vocabulary
tokens as bench/micro/overhead.py sends), tokenized off the loop cut in pieces on every core
(normalize/text_chunks.py) and whole, interleaved; run it under ``taskset -c 0`` for one core.

    python -m bench.micro.normalize_cost [--model smollm2-135m] [--requests 300] [--long-tokens 28500]
"""

import argparse
import asyncio
import os
import random
import statistics
import time
from collections.abc import Callable
from functools import partial

from bench.harness.text_vocab import round_trip_vocab
from bench.workloads.token_blocks import random_tokens
from normalize.chat_tokenizer import ChatTokenizer
from normalize.config import NormalizeConfig
from normalize.normalizer import Normalizer
from normalize.segment_tokenizer import SegmentTokenizer
from radix.hashing import block_hashes

_WORDS = [
    "the",
    "gateway",
    "routes",
    "each",
    "request",
    "to",
    "the",
    "replica",
    "whose",
    "cache",
    "holds",
    "the",
    "longest",
    "prefix",
    "of",
    "its",
    "prompt",
    "tools",
    "schema",
    "policy",
    "résumé",
    "naïve",
    "café",
    "東京",
    "données",
    "1,024",
    "tokens:",
    "always",
    "answer",
    "briefly,",
    "cite",
    "sources.",
]


def system_prompt(tokenizer: ChatTokenizer, target_tokens: int, seed: int) -> str:
    """Random prose of about ``target_tokens`` tokens, with line breaks and trailing-space noise."""
    rng = random.Random(seed)
    lines: list[str] = []
    tokens = 0
    while tokens < target_tokens:
        line = " ".join(rng.choice(_WORDS) for _ in range(12)) + rng.choice(["", " "])
        tokens += len(tokenizer.encode_text(line + "\n"))
        lines.append(line)
    return "\n".join(lines)


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p50, p90, p99 = (ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3 for q in (0.5, 0.9, 0.99))
    return f"p50 {p50:.3f} ms  p90 {p90:.3f} ms  p99 {p99:.3f} ms"


def gateway_cost(normalizer: Normalizer, tokenizer: SegmentTokenizer, model: str) -> Callable[[dict], int]:
    def one_request(body: dict) -> int:
        canonical = normalizer.apply(body).body
        token_ids = tokenizer.encode_chat(canonical["messages"], canonical.get("tools"))
        block_hashes(token_ids, 16, model)
        return len(token_ids)

    return one_request


def timed(run: Callable[[], object], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return samples


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--cold-requests", type=int, default=30)
    parser.add_argument("--long-tokens", type=int, default=0, help="also time distinct prompts this long (0: no)")
    parser.add_argument("--long-requests", type=int, default=20)
    args = parser.parse_args(argv)

    chat = ChatTokenizer.load(args.model)
    normalizer = Normalizer(NormalizeConfig())
    tokenizer = SegmentTokenizer(chat)
    one_request = gateway_cost(normalizer, tokenizer, args.model)
    system = system_prompt(chat, 4060, seed=0)

    def chat_body(system_text: str, question: int) -> dict:
        user = f"Question {question}: which replica should serve a prompt of {question * 7} tokens, and why?"
        return {
            "model": args.model,
            "messages": [{"role": "system", "content": system_text}, {"role": "user", "content": user}],
        }

    prompt_tokens = one_request(chat_body(system, 0))
    bodies = iter([chat_body(system, i) for i in range(1, args.requests + 1)])
    cpu_start = time.process_time()
    warm = timed(lambda: one_request(next(bodies)), args.requests)
    warm_cpu = (time.process_time() - cpu_start) / args.requests
    print(f"prompt: {prompt_tokens} tokens, segmented={tokenizer.segmented}")
    print(f"warm (system prompt seen before): {percentiles(warm)}  cpu/request {warm_cpu * 1e3:.3f} ms")

    cold: list[float] = []
    tokenizer_only: list[float] = []
    for i in range(args.cold_requests):
        body = chat_body(system_prompt(chat, 4060, seed=100 + i), i)
        text = chat.render_chat(normalizer.apply(body).body["messages"])
        tokenizer_only += timed(partial(chat.encode_text, text), 1)
        cold += timed(partial(one_request, body), 1)
    ratio = statistics.median(cold) / statistics.median(tokenizer_only)
    print(f"cold (new system prompt):         {percentiles(cold)}")
    print(f"tokenizer alone (encode ids):     {percentiles(tokenizer_only)}")
    print(f"cold / tokenizer alone (p50):     {ratio:.3f} ({(ratio - 1) * 100:+.1f} %)")
    print(f"cache: {tokenizer.stats()}")
    if args.long_tokens:
        asyncio.run(long_prompts(chat, args.long_tokens, args.long_requests))


async def long_prompts(chat: ChatTokenizer, tokens: int, count: int) -> None:
    """Distinct long prompts through ``encode_prompt_async``: tiktoken in pieces (the default), the
    HF tokenizer in pieces, and the HF tokenizer whole (before both), in rotating order."""
    rng = random.Random(7)
    vocab = round_trip_vocab(chat)
    kinds = {
        "prose": [system_prompt(chat, tokens, seed=1000 + i) for i in range(count)],
        "random tokens": [chat.decode(random_tokens(rng, tokens, vocab)) for _ in range(count)],
    }
    ways = {
        "tiktoken, pieces": SegmentTokenizer(chat),
        "HF, pieces": SegmentTokenizer(chat, tiktoken=False),
        "HF, whole": SegmentTokenizer(chat, chunk_chars=None, tiktoken=False),
    }
    cpus = len(os.sched_getaffinity(0))
    print(f"long prompts: {tokens} tokens, {cpus} CPUs, pieces of {ways['HF, pieces'].chunk_chars} chars")
    for kind, texts in kinds.items():
        samples: dict[str, list[float]] = {name: [] for name in ways}
        for index, text in enumerate(texts):
            names = list(ways)
            for name in names[index % len(names) :] + names[: index % len(names)]:
                start = time.perf_counter()
                await ways[name].encode_prompt_async(text)
                samples[name].append(time.perf_counter() - start)
        whole = statistics.median(samples["HF, whole"])
        for name, values in samples.items():
            print(f"{kind:>13}, {name:>16}: {percentiles(values)}  ({whole / statistics.median(values):.2f}x)")


if __name__ == "__main__":
    main()

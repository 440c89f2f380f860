"""Shared prefix with formatting noise: the same system prompts, sent with random whitespace noise.

``num_groups`` groups each own a multi-line system prompt; each request is a chat with its
group's system prompt and a fresh user question. With probability ``noise_fraction`` the system
prompt is sent with a random mix of CRLF line endings, trailing spaces on some lines, blank space
around the message and invisible characters (BOM, zero-width space): noise that does not change
the prompt's meaning but changes its tokens, which kvgate's default normalization rules undo.
(SmolLM2's chat template does not render tool definitions, so tool key-order noise would not
reach the tokens and is left out.)
"""

import random
from dataclasses import dataclass

from bench.workloads.token_blocks import poisson_arrivals
from bench.workloads.types import BenchRequest

SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ne",
    "ru",
    "ta",
    "so",
    "vi",
    "de",
    "pa",
    "ho",
    "ri",
    "gu",
    "be",
    "an",
    "el",
    "or",
    "ust",
    "ing",
    "ter",
    "pre",
    "con",
    "dis",
    "ble",
]


@dataclass(frozen=True)
class NormalizationNoiseParams:
    num_groups: int = 32
    prompts_per_group: int = 16
    system_prompt_lines: int = 64
    words_per_line: int = 8
    question_words: int = 40
    noise_fraction: float = 1.0
    output_len: int = 16
    request_rate: float = 16.0
    seed: int = 0


def generate(params: NormalizationNoiseParams) -> list[BenchRequest]:
    rng = random.Random(params.seed)
    prompts = [_system_prompt(rng, params) for _ in range(params.num_groups)]
    chats = [
        (group, _words(rng, params.question_words))
        for group in range(params.num_groups)
        for _ in range(params.prompts_per_group)
    ]
    rng.shuffle(chats)
    arrivals = poisson_arrivals(rng, len(chats), params.request_rate)
    requests = []
    for index, ((group, question), arrival) in enumerate(zip(chats, arrivals, strict=False)):
        clean = prompts[group]
        sent = add_noise(rng, clean) if rng.random() < params.noise_fraction else clean
        requests.append(
            BenchRequest(
                request_id=f"noise-{index}",
                session_id=f"noise-{index}",
                arrival_s=arrival,
                max_tokens=params.output_len,
                messages=_chat(sent, question),
                canonical_messages=_chat(clean, question),
                user=f"group-{group}",
                group=f"group-{group}",
            )
        )
    return requests


def add_noise(rng: random.Random, text: str) -> str:
    """At least one kind of meaning-preserving noise, chosen at random."""
    kinds = [kind for kind in _NOISE if rng.random() < 0.5] or [rng.choice(list(_NOISE))]
    for kind in kinds:
        text = _NOISE[kind](rng, text)
    return text


def _crlf(rng: random.Random, text: str) -> str:
    return text.replace("\n", "\r\n")


def _trailing_spaces(rng: random.Random, text: str) -> str:
    lines = text.split("\n")
    for line in rng.sample(range(len(lines)), k=max(1, len(lines) // 5)):
        lines[line] += " " * rng.randint(1, 3)
    return "\n".join(lines)


def _edges(rng: random.Random, text: str) -> str:
    return rng.choice(["\n", " ", "\n\n", "\t"]) + text + rng.choice(["\n", "  ", " \n"])


def _invisible(rng: random.Random, text: str) -> str:
    lines = text.split("\n")
    line = rng.randrange(len(lines))
    lines[line] += "\u200b"
    return "\ufeff" + "\n".join(lines)


_NOISE = {"trailing_spaces": _trailing_spaces, "invisible": _invisible, "crlf": _crlf, "edges": _edges}
"""Applied in this order, so CRLF endings always follow the other line-end noise."""


def _system_prompt(rng: random.Random, params: NormalizationNoiseParams) -> str:
    return "\n".join(_words(rng, params.words_per_line) for _ in range(params.system_prompt_lines))


def _words(rng: random.Random, count: int) -> str:
    return " ".join("".join(rng.choices(SYLLABLES, k=rng.randint(1, 3))) for _ in range(count))


def _chat(system: str, question: str) -> tuple[dict[str, str], ...]:
    return ({"role": "system", "content": system}, {"role": "user", "content": question})

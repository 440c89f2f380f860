"""Twenty-odd spellings of one system prompt and its tools map to the same block hashes when
normalized, and to different ones when normalization is off."""

import copy
import unicodedata

import pytest

from normalize.chat_tokenizer import ChatTokenizer
from normalize.config import NormalizeConfig
from normalize.normalizer import Normalizer
from radix.hashing import block_hashes

MODEL = "smollm2-135m"
LINES = [
    "Current time: {now}",
    "You are the support assistant of Café Zürich, a restaurant in Genève.",
    "Answer in the customer's language; keep replies under three sentences.",
    "Never promise a table: check availability with the book_table tool first.",
    "Opening hours: Tuesday to Sunday, lunch and dinner; closed on Mondays.",
    "Menu highlights: crème brûlée, rösti, fondue moitié-moitié, naïve salad.",
]
NOW = "2026-11-29 10:00"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "book_table",
            "description": "Book a table.",
            "parameters": {
                "type": "object",
                "properties": {"guests": {"type": "integer"}, "time": {"type": "string"}},
                "required": ["guests", "time"],
            },
        },
    }
]


def system(lines: list[str] = LINES, now: str = NOW, end: str = "\n", sep: str = "\n") -> str:
    return sep.join(lines).format(now=now) + end


def reversed_keys(value: object) -> object:
    if isinstance(value, dict):
        return {key: reversed_keys(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [reversed_keys(item) for item in value]
    return value


def trailing(text: str, pad: str) -> str:
    return "\n".join(line + pad for line in text.split("\n"))


CANONICAL = system(end="")
VARIANTS: dict[str, tuple[object, list]] = {
    "canonical": (CANONICAL, TOOLS),
    "trailing newline": (system(), TOOLS),
    "trailing spaces": (trailing(CANONICAL, "  "), TOOLS),
    "trailing tabs": (trailing(CANONICAL, "\t"), TOOLS),
    "trailing nbsp": (trailing(CANONICAL, "\xa0"), TOOLS),
    "crlf": (system(sep="\r\n", end="\r\n"), TOOLS),
    "cr": (system(sep="\r", end=""), TOOLS),
    "nfd": (unicodedata.normalize("NFD", CANONICAL), TOOLS),
    "bom": ("\ufeff" + CANONICAL, TOOLS),
    "zero-width space": (CANONICAL.replace("support", "sup\u200bport"), TOOLS),
    "word joiner": (CANONICAL.replace("Sunday", "Sun\u2060day"), TOOLS),
    "leading blank lines": ("\n\n  " + CANONICAL, TOOLS),
    "surrounding spaces": ("   " + CANONICAL + "   \n\n", TOOLS),
    "tool keys reversed": (CANONICAL, reversed_keys(TOOLS)),
    "tool property order": (
        CANONICAL,
        [
            {
                **TOOLS[0],
                "function": {**TOOLS[0]["function"], "parameters": reversed_keys(TOOLS[0]["function"]["parameters"])},
            }
        ],
    ),
    "nfd and crlf": (unicodedata.normalize("NFD", system(sep="\r\n")), TOOLS),
    "everything": (
        "\ufeff" + trailing(unicodedata.normalize("NFD", CANONICAL), " \t").replace("\n", "\r\n"),
        reversed_keys(TOOLS),
    ),
    "other timestamp": (system(now="2026-11-30 17:45", end=""), TOOLS),
    "iso timestamp": (system(now="2026-12-01T08:15:00Z", end=""), TOOLS),
    "timestamp and crlf": (system(now="2027-01-01 00:00", sep="\r\n"), TOOLS),
    "timestamp and nfd": (unicodedata.normalize("NFD", system(now="2026-11-29 10:01", end=" ")), reversed_keys(TOOLS)),
    "content parts": ([{"type": "text", "text": "  " + CANONICAL + " \r\n"}], TOOLS),
}
SAME_TIME = [name for name in VARIANTS if "timestamp" not in name]


def request(content: object, tools: list) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": content}, {"role": "user", "content": "Can we come at 8?"}],
        "tools": copy.deepcopy(tools),
    }


def hashes(chat: ChatTokenizer, normalizer: Normalizer, content: object, tools: list) -> list[int]:
    body = normalizer.apply(request(content, tools)).body
    return block_hashes(chat.encode_chat(body["messages"], body["tools"]), 16, MODEL)


@pytest.fixture(scope="module")
def normalizer() -> Normalizer:
    return Normalizer(NormalizeConfig(rules={"volatile_spans": True}))


def test_there_are_twenty_plus_distinct_variants() -> None:
    assert len(VARIANTS) >= 20
    assert len({repr(variant) for variant in VARIANTS.values()}) == len(VARIANTS)


def test_normalized_variants_share_block_hashes(tools_chat_tokenizer: ChatTokenizer, normalizer: Normalizer) -> None:
    by_variant = {name: hashes(tools_chat_tokenizer, normalizer, *variant) for name, variant in VARIANTS.items()}
    canonical = by_variant["canonical"]
    assert len(canonical) >= 12
    for name in SAME_TIME:
        assert by_variant[name] == canonical, name

    body = normalizer.apply(request(*VARIANTS["canonical"])).body
    rendered = tools_chat_tokenizer.render_chat(body["messages"], body["tools"])
    stable_tokens = len(tools_chat_tokenizer.encode_text(rendered[: rendered.index("\n\n[volatile #1:")]))
    stable_blocks = stable_tokens // 16 - 1
    assert stable_blocks >= 10
    for name, block_list in by_variant.items():
        assert block_list[:stable_blocks] == canonical[:stable_blocks], name


def shared_blocks(block_list: list[int], reference: list[int]) -> int:
    shared = 0
    for block, other in zip(block_list, reference, strict=False):
        if block != other:
            break
        shared += 1
    return shared


def test_without_normalization_variants_miss(tools_chat_tokenizer: ChatTokenizer, normalizer: Normalizer) -> None:
    """Prefix-cache hits (leading blocks shared with the canonical request), on versus off."""
    shared: dict[str, dict[str, int]] = {}
    for setting, rules in (("on", normalizer), ("off", Normalizer(NormalizeConfig(enabled=False)))):
        by_variant = {name: hashes(tools_chat_tokenizer, rules, *variant) for name, variant in VARIANTS.items()}
        shared[setting] = {name: shared_blocks(blocks, by_variant["canonical"]) for name, blocks in by_variant.items()}
    for name in VARIANTS:
        if name != "canonical":
            assert shared["off"][name] < shared["on"][name], (name, shared)
    assert sum(shared["off"].values()) < sum(shared["on"].values()) / 2, shared

"""Request bodies a hostile but authenticated client sends (issue 28): each is refused or answered,
and none may hold the gateway's event loop. ``bench soak --hostile-clients N`` mixes them in."""

import orjson

from bench.harness.contenders import MODEL


def _chat(system: str, **extra: object) -> dict[str, object]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hi."}]
    return {"model": MODEL, "messages": messages, "max_tokens": 4, **extra}


def hostile_bodies() -> list[tuple[str, str, bytes]]:
    """(name, path, body) of each hostile request, encoded once."""
    chat, completions, responses = "/v1/chat/completions", "/v1/completions", "/v1/responses"
    bodies: list[tuple[str, str, object]] = [
        ("combining marks", chat, _chat("a" + "\u0315\u0316\u0334" * 20_000)),
        (
            "combining marks in instructions",
            responses,
            {"model": MODEL, "instructions": "o" + "\u0301\u0323\u031b" * 20_000, "input": "Hi."},
        ),
        ("volatile-span scan", chat, _chat("1:1:1:1:" * 120_000)),
        ("flat token-id array", completions, {"model": MODEL, "prompt": [11] * 2_000_000, "max_tokens": 4}),
        ("700k-key object", chat, {**_chat("Hi."), "metadata": {f"k{index}": 0 for index in range(700_000)}}),
        ("400k logit_bias keys", chat, _chat("Hi.", logit_bias={str(index): 1 for index in range(400_000)})),
        ("300k stop strings", chat, _chat("Hi.", stop=["zz"] * 300_000)),
        (
            "8 MB of messages",
            chat,
            {
                "model": MODEL,
                "max_tokens": 4,
                "messages": [
                    {"role": "system" if index == 0 else "user", "content": "word " * 860} for index in range(1800)
                ],
            },
        ),
    ]
    return [(name, path, orjson.dumps(body)) for name, path, body in bodies]

"""The Normalizer on whole request bodies: which parts it owns, what it reports, what it keeps."""

import copy
import threading

import pytest
from pydantic import ValidationError

from normalize.config import NormalizeConfig
from normalize.normalizer import Normalizer

NOISY_SYSTEM = "\ufeffYou are kvgate's assistant. \r\nBe brief.\t\r\n\r\nCafe\u0301 menu.  \n"
CANONICAL_SYSTEM = "You are kvgate's assistant.\nBe brief.\n\nCafé menu."
TOOLS = [
    {
        "type": "function",
        "function": {"parameters": {"type": "object", "properties": {"q": {"type": "string"}}}, "name": "search"},
    },
    {"function": {"name": "add", "parameters": {"required": ["a"], "type": "object"}}, "type": "function"},
]


def body(system: str = NOISY_SYSTEM, user: str = " Hi there \r\n", **extra: object) -> dict:
    return {
        "model": "smollm2-135m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        **extra,
    }


def test_defaults_canonicalize_system_and_tools_only() -> None:
    request = body(tools=TOOLS, cache_salt="tenant-a", temperature=0.2)
    original = copy.deepcopy(request)
    result = Normalizer(NormalizeConfig()).apply(request)
    assert request == original
    assert result.body is not request
    assert result.body["messages"][0]["content"] == CANONICAL_SYSTEM
    assert result.body["messages"][1] is request["messages"][1]
    assert result.body["cache_salt"] == "tenant-a" and result.body["temperature"] == 0.2
    assert [list(tool) for tool in result.body["tools"]] == [["function", "type"], ["function", "type"]]
    assert list(result.body["tools"][0]["function"]) == ["name", "parameters"]
    assert list(result.body["tools"][0]["function"]["parameters"]) == ["properties", "type"]
    assert [tool["function"]["name"] for tool in result.body["tools"]] == ["search", "add"]
    assert result.changed == [
        "invisible_chars",
        "nfc",
        "line_endings",
        "trailing_whitespace",
        "strip_message",
        "canonical_tools",
    ]


def test_canonical_request_is_left_alone() -> None:
    normalizer = Normalizer(NormalizeConfig(rules={"sort_tools": True}))
    canonical = normalizer.apply(body(tools=TOOLS)).body
    again = normalizer.apply(canonical)
    assert again.changed == []
    assert again.body == canonical
    assert again.body["messages"][0] is canonical["messages"][0]


def test_user_messages_only_where_configured() -> None:
    config = NormalizeConfig(roles=["system", "developer", "user"])
    result = Normalizer(config).apply(body())
    assert result.body["messages"][1]["content"] == "Hi there"


def test_disabled_forwards_as_sent() -> None:
    request = body(tools=TOOLS)
    result = Normalizer(NormalizeConfig(enabled=False)).apply(request)
    assert result.changed == [] and result.body is request


def test_a_body_no_rule_changes_is_not_copied() -> None:
    request = body(system="You are helpful.")
    result = Normalizer(NormalizeConfig()).apply(request)
    assert result.changed == [] and result.body is request


def test_each_rule_switch_turns_its_rule_off() -> None:
    switches = ["invisible_chars", "nfc", "line_endings", "trailing_whitespace", "strip_message", "canonical_tools"]
    for switch in switches:
        result = Normalizer(NormalizeConfig(rules={switch: False})).apply(body(tools=TOOLS))
        assert switch not in result.changed
        assert set(result.changed) == set(switches) - {switch}


def test_opt_in_rules() -> None:
    config = NormalizeConfig(rules={"collapse_spaces": True, "sort_tools": True, "volatile_spans": True})
    result = Normalizer(config).apply(body(system="Now: 2026-11-29 10:00.  Reply   briefly.", tools=TOOLS))
    assert (
        result.body["messages"][0]["content"] == "Now: [volatile #1]. Reply briefly.\n\n[volatile #1: 2026-11-29 10:00]"
    )
    assert [tool["function"]["name"] for tool in result.body["tools"]] == ["add", "search"]
    assert result.changed == ["volatile_spans", "collapse_spaces", "canonical_tools", "sort_tools"]


def test_volatile_stable_part_is_byte_identical() -> None:
    normalizer = Normalizer(NormalizeConfig(rules={"volatile_spans": True}))
    first = normalizer.apply(
        body(system="Time: 2026-11-29T10:00:00Z\nUser id 123e4567-e89b-12d3-a456-426614174000.\nRules.")
    )
    second = normalizer.apply(
        body(system="Time: 2026-11-30T23:59:59Z \r\nUser id 9e4a1b2c-0000-4d3a-9abc-426614174999.\nRules.")
    )
    stable = "Time: [volatile #1]\nUser id [volatile #2].\nRules.\n\n"
    assert first.body["messages"][0]["content"].startswith(stable)
    assert second.body["messages"][0]["content"].startswith(stable)
    assert second.body["messages"][0]["content"].endswith("[volatile #2: 9e4a1b2c-0000-4d3a-9abc-426614174999]")


def test_content_parts() -> None:
    config = NormalizeConfig(rules={"volatile_spans": True})
    parts = [
        {"type": "text", "text": "  Today 2026-11-29. \r\n"},
        {"type": "image_url", "image_url": {"url": "data:x"}},
        {"type": "text", "text": "Be brief.  \n"},
    ]
    request = {"messages": [{"role": "developer", "content": parts}]}
    result = Normalizer(config).apply(request)
    new_parts = result.body["messages"][0]["content"]
    assert new_parts[0] == {"type": "text", "text": "Today [volatile #1].\n"}
    assert new_parts[1] is parts[1]
    assert new_parts[2] == {"type": "text", "text": "Be brief.\n\n[volatile #1: 2026-11-29]"}
    assert request["messages"][0]["content"][0]["text"] == "  Today 2026-11-29. \r\n"


def test_completions_prompt_only_where_configured() -> None:
    request = {"model": "m", "prompt": "\ufeffOn 2026-11-29, Cafe\u0301 \r\nA: "}
    assert Normalizer(NormalizeConfig()).apply(request).body["prompt"] == request["prompt"]
    config = NormalizeConfig(completions_prompt=True, rules={"volatile_spans": True, "collapse_spaces": True})
    result = Normalizer(config).apply(request)
    assert result.body["prompt"] == "On 2026-11-29, Café \nA: "
    assert result.changed == ["invisible_chars", "nfc", "line_endings"]


def test_malformed_parts_are_left_to_validation() -> None:
    request = {"messages": ["not a message", {"role": "system", "content": None}, {"role": "system"}], "tools": "x"}
    result = Normalizer(NormalizeConfig()).apply(request)
    assert result.body == request and result.changed == []


@pytest.mark.parametrize(
    "section",
    [
        {"rules": {"no_such_rule": True}},
        {"volatile_spans": ["no_such_preset"]},
        {"volatile_spans": [{"name": "bad", "pattern": "("}]},
        {"volatile_spans": [{"name": "empty", "pattern": "x*"}]},
        {"unknown": 1},
    ],
)
def test_config_rejects_mistakes(section: dict) -> None:
    with pytest.raises(ValidationError):
        NormalizeConfig.model_validate(section)


def test_responses_instructions_and_input_items_are_messages() -> None:
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": NOISY_SYSTEM}]},
        {"role": "user", "content": " Hi there \r\n"},
    ]
    request = {"model": "smollm2-135m", "instructions": NOISY_SYSTEM, "input": items}
    original = copy.deepcopy(request)
    result = Normalizer(NormalizeConfig()).apply(request, responses=True)
    assert request == original
    assert result.body["instructions"] == CANONICAL_SYSTEM
    assert result.body["input"][0]["content"][0] == {"type": "input_text", "text": CANONICAL_SYSTEM}
    assert result.body["input"][1] is items[1], "user items only where configured"
    canonical = Normalizer(NormalizeConfig()).apply(result.body, responses=True)
    assert canonical.changed == [] and canonical.body["input"] is result.body["input"]
    plain = {"model": "m", "input": " Hi \r\n"}
    assert Normalizer(NormalizeConfig()).apply(plain, responses=True).body["input"] == " Hi \r\n"
    with_user = Normalizer(NormalizeConfig(roles=["system", "user"]))
    assert with_user.apply(plain, responses=True).body["input"] == "Hi"


def test_embedding_inputs_are_never_normalized() -> None:
    normalizer = Normalizer(NormalizeConfig(roles=["system", "user"]))
    for given in (" Hi \r\n", [" Hi \r\n", "x "], [1, 2]):
        result = normalizer.apply({"model": "m", "input": given})
        assert result.body["input"] is given and result.changed == []


async def test_a_large_body_is_normalized_on_a_worker_thread_with_the_same_result() -> None:
    """Issue 28.1/28.14: long text (combining-mark runs, volatile spans) is normalized off the event loop."""
    config = NormalizeConfig.model_validate({"rules": {"volatile_spans": True}, "roles": ["system", "developer"]})
    normalizer = Normalizer(config)
    large = body(system="Now: 2026-11-29 10:00.\r\n" + "o" + "\u0315\u0316\u0334" * 12_000 + " 12:30 pm")
    small = body()
    for request in (large, small):
        assert (await normalizer.apply_async(request)) == normalizer.apply(request)
    threads: list[str] = []
    original = normalizer.apply

    def recording(request: dict, *, responses: bool = False) -> object:
        threads.append(threading.current_thread().name)
        return original(request, responses=responses)

    normalizer.apply = recording  # type: ignore[method-assign]
    await normalizer.apply_async(large)
    await normalizer.apply_async(small)
    assert threads[0] != threading.main_thread().name and threads[1] == threading.main_thread().name


async def test_only_text_the_rules_read_sends_a_body_to_a_worker_thread() -> None:
    """A long message of a role the rules leave alone (a pasted document) stays on the loop, where
    it costs nothing; the same text in a normalized role, or a Responses input of one, goes off it."""
    long = "Read this. " * 4_000
    normalizer = Normalizer(NormalizeConfig(roles=["system"]))
    threads: list[str] = []
    original = normalizer.apply

    def recording(request: dict, *, responses: bool = False) -> object:
        threads.append(threading.current_thread().name)
        return original(request, responses=responses)

    normalizer.apply = recording  # type: ignore[method-assign]
    responses_input = {"model": "m", "input": [{"role": "system", "content": [{"type": "input_text", "text": long}]}]}
    await normalizer.apply_async(body(user=long))
    await normalizer.apply_async({"model": "m", "input": long}, responses=True)
    await normalizer.apply_async(body(system=long))
    await normalizer.apply_async(responses_input, responses=True)
    await normalizer.apply_async({"model": "m", "instructions": long, "input": "Hi"}, responses=True)
    on_loop = [thread == threading.main_thread().name for thread in threads]
    assert on_loop == [True, True, False, False, False]

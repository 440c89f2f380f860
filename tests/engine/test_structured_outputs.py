"""Grammars, tool-call parsing and tool rendering without the model: llguidance on SmolLM2's real tokenizer."""

import json

import llguidance
import numpy as np
import pytest
import torch

from engine.core.sequence import Sequence
from engine.model.grammar import GrammarCompiler, MaskFiller, allocate_bitmask, llguidance_tokenizer_json
from engine.model.runner_api import SamplingParams
from engine.model.sampler import apply_token_bitmask
from engine.server.structured_output import requested_grammar
from engine.server.tool_choice import ToolMode, tool_grammar, tool_mode
from engine.server.tool_parser import ToolCallStream, parse_answer
from normalize.chat_tokenizer import ChatTokenizer
from protocol.openai import ChatCompletionRequest, CompletionRequest, validate
from protocol.openai_errors import OpenAIError
from tests.normalize.transformers_517 import GGUF_517_DECODER

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}},
]
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tokenizer() -> ChatTokenizer:
    return ChatTokenizer.load("smollm2-135m")


@pytest.fixture(scope="module")
def compiler(tokenizer: ChatTokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer)


def chat(**fields: object) -> ChatCompletionRequest:
    return validate({"messages": MESSAGES, **fields}, ChatCompletionRequest)


def walk(compiler: GrammarCompiler, tokenizer: ChatTokenizer, grammar_text: str, fields: dict) -> bool:
    """Whether the grammar the request asks for accepts ``grammar_text`` token by token, each token in its mask."""
    grammar = requested_grammar(chat(**fields), compiler)
    assert grammar is not None
    matcher = grammar.matcher()
    for token in tokenizer.encode_text(grammar_text):
        bitmask = allocate_bitmask(1, matcher.vocab_size)
        MaskFiller().fill([matcher], [0], bitmask)
        if not (int(bitmask[0, token // 32]) >> (token % 32)) & 1:
            return False
        matcher.accept(token)
    return matcher.complete


def test_json_schema_masks_admit_a_valid_instance_and_nothing_else(compiler, tokenizer) -> None:
    fields = {"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}}}
    assert walk(compiler, tokenizer, '{"city": "Paris", "unit": "celsius"}', fields)
    assert not walk(compiler, tokenizer, '{"city": "Paris", "unit": "kelvin"}', fields)
    assert not walk(compiler, tokenizer, '{"city": "Paris"}', fields)


def test_vllm_guided_fields_and_json_object(compiler, tokenizer) -> None:
    assert walk(compiler, tokenizer, "no", {"guided_choice": ["yes", "no"]})
    assert walk(compiler, tokenizer, "123-ab", {"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}})
    assert walk(compiler, tokenizer, '{"a": [1, 2]}', {"response_format": {"type": "json_object"}})
    assert not walk(compiler, tokenizer, "[1, 2]", {"response_format": {"type": "json_object"}})
    completion = validate({"prompt": "x", "guided_json": json.dumps(WEATHER)}, CompletionRequest)
    assert requested_grammar(completion, compiler) is not None


@pytest.mark.parametrize(
    ("fields", "param", "named"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"not": {}}}}},
            "response_format",
            "not",
        ),
        ({"guided_json": {"if": {"type": "string"}, "then": {}}}, "guided_json", "if"),
        ({"guided_json": {}, "guided_regex": "a+"}, "guided_regex", "only one"),
        ({"structured_outputs": {"grammar": "root ::= x"}}, "structured_outputs", "grammar"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "schema"),
    ],
)
def test_what_cannot_be_enforced_is_a_400_naming_it(compiler, fields, param, named) -> None:
    with pytest.raises(OpenAIError) as raised:
        requested_grammar(chat(**fields), compiler)
    assert raised.value.status == 400
    assert raised.value.body()["error"]["param"].startswith(param)
    assert named in raised.value.body()["error"]["message"]


def test_tool_choice_modes_and_their_grammars(compiler, tokenizer) -> None:
    named = tool_mode(chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    assert named is not None and named.named == "get_weather"
    required = tool_mode(chat(tools=TOOLS, tool_choice="required"))
    assert required is not None
    grammar = tool_grammar(required, compiler)
    assert grammar is not None
    matcher = grammar.matcher()
    for token in tokenizer.encode_text('{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}'):
        matcher.accept(token)
    assert matcher.complete
    assert tool_mode(chat(tools=TOOLS)) == ToolMode("auto", named.functions)
    for bad in [{"tool_choice": "required"}, {"tools": TOOLS, "tool_choice": {"function": {"name": "nope"}}}]:
        with pytest.raises(OpenAIError):
            tool_mode(chat(**bad))


def assembled(stream: ToolCallStream, text: str, piece: int) -> tuple[str, list[tuple[str, str]]]:
    """Content and (name, arguments) of each call, from the text fed ``piece`` characters at a time."""
    content, calls = "", []
    pieces = [text[start : start + piece] for start in range(0, len(text), piece)]
    for position, delta_text in enumerate(pieces):
        for delta in stream.feed(delta_text, position == len(pieces) - 1):
            content += delta.get("content", "")
            for call in delta.get("tool_calls", []):
                if "id" in call:
                    assert call["id"].startswith("call_") and call["type"] == "function"
                    calls.append((call["function"]["name"], ""))
                name, arguments = calls[call["index"]]
                calls[call["index"]] = (name, arguments + call["function"]["arguments"])
    return content, calls


@pytest.mark.parametrize("piece", [1, 3, 50])
def test_streamed_tool_calls_assemble_to_the_whole_answer(piece: int) -> None:
    functions = {"get_weather": WEATHER, "add": {}}
    cases = [
        (ToolMode("named", functions, "get_weather"), '{"city": "Oslo", "unit": "celsius"}'),
        (ToolMode("required", functions), '{"name": "add", "arguments": {"a": 1}}'),
        (ToolMode("auto", functions), 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>'),
        (ToolMode("auto", functions), "No call here, just <tool text."),
    ]
    for mode, text in cases:
        content, calls = parse_answer(mode, text)
        streamed_content, streamed_calls = assembled(ToolCallStream(mode), text, piece)
        assert streamed_calls == [(call.name, call.arguments) for call in calls], text
        assert streamed_content.strip() == (content or ""), text
    assert parse_answer(ToolMode("auto", functions), "<tool_call>{broken")[1] == []
    two = (
        '<tool_call>{"name": "add", "arguments": {}}</tool_call><tool_call>{"name": "add", "arguments": {}}</tool_call>'
    )
    assert len(parse_answer(ToolMode("auto", functions), two)[1]) == 2
    assert len(parse_answer(ToolMode("auto", functions, parallel=False), two)[1]) == 1


def test_tools_render_into_the_system_prompt_of_a_template_without_tools(tokenizer) -> None:
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    prompt = tokenizer.render_chat(history, TOOLS)
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(TOOLS[0]) in prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in prompt
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>" in prompt
    assert "# Tools" not in tokenizer.render_chat(MESSAGES)


def test_a_sequence_stops_when_its_grammar_is_complete_and_masks_apply_per_row(compiler, tokenizer) -> None:
    grammar = requested_grammar(chat(guided_choice=["yes"]), compiler)
    seq = Sequence(0, [1, 2], SamplingParams(max_tokens=10, constraint=grammar), 100, eos_token_id=2)
    seq.append_token(tokenizer.encode_text("yes")[0])
    assert seq.finish_reason == "stop"
    assert seq.constraint is not None
    bitmask = allocate_bitmask(2, compiler.vocab_size)
    bitmask[1] = 0
    bitmask[1, 0] = 1 << 5
    logits = apply_token_bitmask(torch.zeros(3, compiler.vocab_size), [0, 2], bitmask)
    assert torch.isfinite(logits[:2]).all()
    assert torch.isfinite(logits[2]).nonzero().flatten().tolist() == [5]
    assert np.all(bitmask[0] == -1)


def test_llguidance_reads_token_bytes_through_a_decoder_chain_that_ends_byte_level(tokenizer: ChatTokenizer) -> None:
    plain = json.loads(tokenizer.tokenizer.to_str())
    chained = json.dumps({**plain, "decoder": GGUF_517_DECODER})
    expected = llguidance.LLTokenizer(json.dumps(plain), eos_token=tokenizer.eos_token_id)
    as_read = llguidance.LLTokenizer(llguidance_tokenizer_json(chained), eos_token=tokenizer.eos_token_id)
    space_quote = tokenizer.tokenizer.encode(' "').ids
    assert expected.decode_bytes(space_quote) == b' "'
    assert llguidance.LLTokenizer(chained, eos_token=tokenizer.eos_token_id).decode_bytes(space_quote) != b' "', (
        "llguidance now reads the chain itself: llguidance_tokenizer_json may go"
    )
    assert all(as_read.decode_bytes([i]) == expected.decode_bytes([i]) for i in range(expected.vocab_size))
    assert llguidance_tokenizer_json(json.dumps(plain)) == json.dumps(plain), "a plain decoder is left alone"

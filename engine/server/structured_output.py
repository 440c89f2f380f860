"""The one grammar a request's output must match, from whichever field asks for it.

OpenAI's ``response_format`` (``json_schema``, strict or not, and ``json_object``), vLLM's
``structured_outputs`` (``json``, ``regex``, ``choice``, ``json_object``) and its older
``guided_json`` / ``guided_regex`` / ``guided_choice``. Two of them at once, or a forced tool call
with any of them, is a 400: the answer cannot follow two grammars.
"""

import json
from typing import Any

from engine.model.grammar import Grammar, GrammarCompiler
from protocol.openai import GenerationRequest
from protocol.openai_errors import bad_request

ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}


def requested_grammar(request: GenerationRequest, compiler: GrammarCompiler) -> Grammar | None:
    """The checked grammar the request asks for (None: free text); a 400 names a field it cannot enforce."""
    found = [grammar for grammar in _sources(request, compiler) if grammar is not None]
    if len(found) > 1:
        params = ", ".join(grammar.param for grammar in found)
        raise bad_request(f"only one output constraint may be given, not {params}", found[1].param)
    return found[0] if found else None


def constraint_fields(request: GenerationRequest) -> list[str]:
    """The fields of ``request`` that ask for a constrained output (for engines that cannot follow one)."""
    fields = [
        name
        for name in ("structured_outputs", "guided_json", "guided_regex", "guided_choice")
        if getattr(request, name) is not None
    ]
    if request.response_format is not None and request.response_format.type != "text":
        fields.insert(0, "response_format")
    return fields


def _sources(request: GenerationRequest, compiler: GrammarCompiler) -> list[Grammar | None]:
    grammars = [_response_format(request, compiler)]
    structured = request.structured_outputs
    if structured is not None:
        grammars.append(
            _one_of(
                compiler,
                "structured_outputs",
                json_schema=structured.json_,
                regex=structured.regex,
                choice=structured.choice,
                json_object=structured.json_object,
                extra=structured.model_extra,
            )
        )
    if request.guided_json is not None:
        grammars.append(compiler.json_schema(_schema(request.guided_json, "guided_json"), "guided_json"))
    if request.guided_regex is not None:
        grammars.append(compiler.regex(request.guided_regex, "guided_regex"))
    if request.guided_choice is not None:
        grammars.append(compiler.choice(request.guided_choice, "guided_choice"))
    return grammars


def _response_format(request: GenerationRequest, compiler: GrammarCompiler) -> Grammar | None:
    response_format = request.response_format
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return compiler.json_schema(ANY_JSON_OBJECT, "response_format")
    spec = response_format.json_schema
    if spec is None or spec.schema_ is None:
        raise bad_request(
            "response_format of type 'json_schema' needs json_schema.schema",
            "response_format.json_schema.schema",
            "missing_required_parameter",
        )
    return compiler.json_schema(spec.schema_, "response_format.json_schema.schema")


def _one_of(
    compiler: GrammarCompiler,
    param: str,
    json_schema: dict[str, Any] | str | None,
    regex: str | None,
    choice: list[str] | None,
    json_object: bool | None,
    extra: dict[str, Any] | None,
) -> Grammar | None:
    if extra:
        names = ", ".join(sorted(extra))
        raise bad_request(
            f"{param}: {names} not supported here (json, regex, choice and json_object are)", param, "unsupported_value"
        )
    given = {
        "json": json_schema is not None,
        "regex": regex is not None,
        "choice": choice is not None,
        "json_object": bool(json_object),
    }
    if sum(given.values()) != 1:
        raise bad_request(f"{param} must set exactly one of json, regex, choice and json_object", param)
    if json_schema is not None:
        return compiler.json_schema(_schema(json_schema, f"{param}.json"), f"{param}.json")
    if regex is not None:
        return compiler.regex(regex, f"{param}.regex")
    if choice is not None:
        return compiler.choice(choice, f"{param}.choice")
    return compiler.json_schema(ANY_JSON_OBJECT, f"{param}.json_object")


def _schema(value: dict[str, Any] | str, param: str) -> dict[str, Any]:
    """A schema given as an object or as its JSON text."""
    if isinstance(value, dict):
        return value
    try:
        schema = json.loads(value)
    except json.JSONDecodeError as exc:
        raise bad_request(f"{param} is not valid JSON: {exc}", param) from None
    if not isinstance(schema, dict):
        raise bad_request(f"{param} must be a JSON schema object", param)
    return schema

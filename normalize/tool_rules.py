"""Tool-definition rules. Tools are forwarded as JSON objects and chat templates render them with
``tojson`` in dict order, so the canonical form is the key order of the dicts themselves."""

from typing import Any


def sort_keys_recursively(value: Any) -> Any:
    """A copy of a JSON value with every object's keys in sorted order."""
    if isinstance(value, dict):
        return {key: sort_keys_recursively(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [sort_keys_recursively(item) for item in value]
    return value


def keys_sorted(value: Any) -> bool:
    """Whether every object inside a JSON value already has its keys in sorted order."""
    if isinstance(value, dict):
        keys = list(value)
        return keys == sorted(keys) and all(keys_sorted(item) for item in value.values())
    if isinstance(value, list):
        return all(keys_sorted(item) for item in value)
    return True


def tool_name(tool: Any) -> str:
    """The function name of an OpenAI tool definition ('' when it has none)."""
    if isinstance(tool, dict):
        function = tool.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            return function["name"]
    return ""

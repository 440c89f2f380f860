"""The Anthropic Messages API front end: translation to and from chat completions, at the edge.

The routing core (normalize, tokenize, route, admit, proxy) sees only the chat-completion body
this package builds; see docs/anthropic.md.
"""

"""The Anthropic Messages API front end: translation to and from chat completions, at the edge.

The routing core (normalize, tokenize, route, admit, proxy) sees only the chat-completion body
this package builds. A replica that serves ``/v1/messages`` itself (``backends[].anthropic_messages``)
gets the client's body instead and its answer is relayed (``native_stream.py``); see docs/anthropic.md.
"""

"""Wire contracts shared by the gateway and the engine (neither imports the other).

Lowest layer, beside ``radix``, ``normalize`` and ``planner``: OpenAI request schemas and error
bodies, and the replica's stats and load report.
"""

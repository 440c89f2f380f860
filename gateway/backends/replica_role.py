"""A replica's phase in disaggregated prefill and decode (docs/routing.md), as the config declares it."""

from typing import Literal

ReplicaRole = Literal["prefill", "decode", "both"]
"""``prefill`` replicas only get prefill legs (never a client's whole request), ``decode`` replicas
never get one, ``both`` (the default) serve either."""

"""A bound on how many prompts of one tenant are tokenized at once.

Tokenizing a long prompt is the gateway's most expensive step and runs on one worker thread
shared by every tenant. Each tenant gets ``per_tenant`` places in it, so a tenant that sends
many long prompts waits behind its own, and another tenant's request waits for at most
``per_tenant`` of the first tenant's prompts.
"""

import asyncio

TOKENIZE_PER_TENANT = 2


class TokenizeSlots:
    def __init__(self, per_tenant: int = TOKENIZE_PER_TENANT) -> None:
        self.per_tenant = per_tenant
        self._slots: dict[str, asyncio.Semaphore] = {}

    def hold(self, tenant: str) -> asyncio.Semaphore:
        """The tenant's places, to hold one with ``async with``."""
        slots = self._slots.get(tenant)
        if slots is None:
            slots = self._slots[tenant] = asyncio.Semaphore(self.per_tenant)
        return slots

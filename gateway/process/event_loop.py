"""The event loop the gateway runs on: uvloop when it is installed (faster sockets and callbacks),
else asyncio's own. ``KVGATE_EVENT_LOOP=asyncio`` picks asyncio's loop anyway."""

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    if os.environ.get("KVGATE_EVENT_LOOP", "uvloop") == "uvloop":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(main)
    return asyncio.run(main)

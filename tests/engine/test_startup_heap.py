"""The engine freezes what it built at start (protocol/startup_heap.py): full garbage collections
while it serves no longer walk the model, tokenizer and grammar tables with the event loop stopped."""

import asyncio
import gc

from aiohttp.test_utils import TestServer

from engine.cli import build_parser, build_server, config_from_args


def test_the_started_engine_leaves_its_startup_objects_out_of_collections() -> None:
    server = build_server(config_from_args(build_parser().parse_args(["--sim", "--num-blocks", "600"])))
    tokenizer_table = server.tokenizer

    async def frozen_while_serving() -> tuple[int, bool]:
        async with TestServer(server.build_app()):
            return gc.get_freeze_count(), gc.is_tracked(tokenizer_table) and _is_frozen(tokenizer_table)

    gc.unfreeze()
    try:
        frozen, tokenizer_frozen = asyncio.run(frozen_while_serving())
    finally:
        gc.unfreeze()
    assert frozen > 10_000
    assert tokenizer_frozen


def _is_frozen(thing: object) -> bool:
    """Frozen objects sit in the permanent generation, which ``gc.get_objects`` of any generation omits."""
    return all(thing is not other for generation in range(3) for other in gc.get_objects(generation))

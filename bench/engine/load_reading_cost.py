"""What the engine's load reading costs per step as its queue grows: ``queued_prefill_tokens`` and
``prefix_waits`` over a queue of long prompts held behind one being computed (a burst on a new
system prompt), the case the reading walks furthest. The engine takes it twice a step. Run:
``python -m bench.engine.load_reading_cost``."""

import argparse
import time
from collections.abc import Callable

from engine.core.block_manager import BlockManager
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.model.runner_api import SamplingParams

BLOCK_SIZE = 16


def held_burst(waiting: int, prompt_tokens: int) -> Scheduler:
    """A leader one chunk into its prefill and ``waiting`` prompts that share it, queued behind it."""
    shared = list(range(100, 100 + prompt_tokens))
    blocks = (waiting + 2) * (prompt_tokens // BLOCK_SIZE + 2)
    scheduler = Scheduler(BlockManager(blocks, BLOCK_SIZE, "m"), waiting + 1, 2048)

    def sequence(seq_id: int, tail: list[int]) -> Sequence:
        prompt = shared + tail
        return Sequence(seq_id, prompt, SamplingParams(max_tokens=4), max_total_tokens=len(prompt) + 4)

    scheduler.add(sequence(0, []))
    scheduler.schedule()
    for seq_id in range(1, waiting + 1):
        scheduler.add(sequence(seq_id, [seq_id, seq_id + 1]))
    return scheduler


def per_call_ms(call: Callable[[], object], repeats: int) -> float:
    started = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - started) / repeats * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--waiting", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--prompt-tokens", type=int, default=28_000)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)
    print(f"| prompts held ({args.prompt_tokens:,} tokens each) | queued_prefill_tokens (ms) | prefix_waits (ms) |")
    print("|---|---|---|")
    for waiting in args.waiting:
        scheduler = held_burst(waiting, args.prompt_tokens)
        assert list(scheduler.prefix_waits().values())[0][1] == waiting, "every prompt is held behind the leader"
        queued = per_call_ms(scheduler.queued_prefill_tokens, args.repeats)
        held = per_call_ms(scheduler.prefix_waits, args.repeats)
        print(f"| {waiting:,} | {queued:.3f} | {held:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

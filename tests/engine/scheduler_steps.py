"""Drive a ``Scheduler`` step by step with the instant sim cost model, as the engine loop does."""

from engine.core.scheduler import Scheduler
from engine.model.runner_api import SeqChunk
from engine.sim.sim_runner import SIM_PRESETS, SimRunner

BLOCK = 4
WORDS = list(range(1000, 1010))


def run_step(scheduler: Scheduler) -> list[SeqChunk]:
    """One engine step with the instant cost model; finished sequences leave the scheduler."""
    runner = SimRunner(BLOCK, scheduler.block_manager.num_blocks, SIM_PRESETS["instant"], WORDS)
    step = scheduler.schedule()
    scheduler.postprocess(step, runner.execute(step.chunks))
    for seq in step.seqs:
        if seq.finish_reason is not None:
            scheduler.finish(seq)
    scheduler.assert_invariants()
    return step.chunks

"""LoRA adapters on the real bundled SmolLM2: greedy output equals PEFT's, per request, in mixed
batches, and an adapter's prompt blocks are its own in the prefix cache."""

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from engine.core.block_manager import BlockManager
from engine.core.llm_engine import LLMEngine
from engine.core.metrics import EngineMetrics
from engine.core.scheduler import Scheduler
from engine.model.lora_modules import LoRAModule, LoRARef, check_modules, lora_refs
from engine.model.model_runner import TorchModelRunner
from engine.model.runner_api import SamplingParams
from normalize.chat_tokenizer import ChatTokenizer
from tests.lora_adapter import base_model_folder, make_lora_adapter

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
MAX_TOKENS = 10
BLOCK_SIZE = 4
PROMPTS = ["The capital of France is", "Here is a list of fruits: apple, banana,"]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread: two spin-waiting threads on a busy 2-core machine cost several times more."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def adapter_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``full``: every projection, rank 8. ``partial``: q, v and up only (slices of the fused
    projections), rank 4, rsLoRA scaling."""
    root = tmp_path_factory.mktemp("lora")
    full = make_lora_adapter(root / "full", seed=1)
    partial = make_lora_adapter(
        root / "partial", seed=2, rank=4, alpha=8, target_modules=("q_proj", "v_proj", "up_proj")
    )
    config_path = partial / "adapter_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "use_rslora": True}))
    return {"full": full, "partial": partial}


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    tokenizer = ChatTokenizer.load(MODEL)
    return [tokenizer.encode_text(text) for text in PROMPTS]


def _greedy(model: Any, prompts: list[list[int]]) -> list[list[int]]:
    outputs = []
    for prompt in prompts:
        generated = model.generate(
            torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        outputs.append(generated[0, len(prompt) :].tolist())
    return outputs


@pytest.fixture(scope="module")
def expected(adapter_folders: dict[str, Path], prompts: list[list[int]]) -> dict[str | None, list[list[int]]]:
    """Greedy continuations by transformers (base) and by PEFT's own LoRA layers (each adapter), float32."""
    references: dict[str | None, list[list[int]]] = {}
    for name in (None, *adapter_folders):
        model: Any = AutoModelForCausalLM.from_pretrained(base_model_folder(MODEL), dtype=torch.float32)
        if name is not None:
            model = PeftModel.from_pretrained(model, adapter_folders[name])
        references[name] = _greedy(model.eval(), prompts)
    return references


@pytest.fixture(scope="module")
def adapters(adapter_folders: dict[str, Path]) -> dict[str, LoRARef]:
    return lora_refs(tuple(LoRAModule(name, path) for name, path in adapter_folders.items()))


@pytest.fixture(
    scope="module",
    params=["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))],
)
def engine(adapter_folders: dict[str, Path], request: pytest.FixtureRequest) -> LLMEngine:
    """A 16-token step budget: the mixed batch's prompts are prefilled in chunks while earlier
    ones decode, so one step holds decode and prefill rows of several adapters. On the CPU, and on
    a CUDA device where there is one (float32 on both: PEFT's greedy output is the reference)."""
    modules = tuple(LoRAModule(name, path) for name, path in adapter_folders.items())
    configs = tuple(check_modules(modules, MODEL, max_rank=16))
    num_blocks = 64
    runner = TorchModelRunner(
        MODEL, block_size=BLOCK_SIZE, num_blocks=num_blocks, device=request.param, adapters=configs
    )
    scheduler = Scheduler(BlockManager(num_blocks, BLOCK_SIZE, MODEL), max_num_seqs=8, max_num_batched_tokens=16)
    tokenizer = ChatTokenizer.load(MODEL).tokenizer
    return LLMEngine(runner, scheduler, tokenizer, EngineMetrics(MODEL, BLOCK_SIZE, num_blocks), check_invariants=True)


Run = tuple[list[int], LoRARef | None]


async def _one(engine: LLMEngine, prompt: list[int], adapter: LoRARef | None) -> tuple[list[int], int]:
    """Generated tokens and cached prompt tokens of one greedy request."""
    tokens: list[int] = []
    cached = 0
    sampling = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    async for output in engine.generate(prompt, sampling, 256, None, adapter=adapter):
        tokens.extend(output.token_ids)
        cached = output.num_cached_tokens
    return tokens, cached


def _run(engine: LLMEngine, batches: list[list[Run]]) -> list[list[tuple[list[int], int]]]:
    """Each batch's requests submitted together; batches one after another, on one engine run."""

    async def drive() -> list[list[tuple[list[int], int]]]:
        engine.start(asyncio.get_running_loop())
        try:
            return [list(await asyncio.gather(*(_one(engine, *run) for run in batch))) for batch in batches]
        finally:
            await asyncio.to_thread(engine.stop)

    engine.block_manager.reset_prefix_cache()
    return asyncio.run(drive())


def test_greedy_output_equals_peft_alone_and_in_a_mixed_batch(
    engine: LLMEngine,
    adapters: dict[str, LoRARef],
    prompts: list[list[int]],
    expected: dict[str | None, list[list[int]]],
) -> None:
    names: list[str | None] = [None, "full", "partial"]
    assert expected["full"] != expected[None] and expected["partial"] != expected[None], "the adapters change output"
    mixed = [(prompt, adapters[name] if name else None) for prompt in prompts for name in names]
    singles = [[(prompts[0], adapters[name] if name else None)] for name in names]
    mixed_outputs, *single_outputs = _run(engine, [mixed, *singles])
    by_request = iter(mixed_outputs)
    for index in range(len(prompts)):
        for name in names:
            assert next(by_request)[0] == expected[name][index], f"prompt {index} under {name or 'the base model'}"
    assert [outputs[0][0] for outputs in single_outputs] == [expected[name][0] for name in names]


def test_adapter_blocks_are_never_shared_with_the_base_model_or_another_adapter(
    engine: LLMEngine, adapters: dict[str, LoRARef], prompts: list[list[int]]
) -> None:
    prompt = prompts[1]
    full, partial = adapters["full"], adapters["partial"]
    runs: list[Run] = [(prompt, None), (prompt, full), (prompt, full), (prompt, partial), (prompt, None)]
    results = [outputs[0] for outputs in _run(engine, [[run] for run in runs])]
    full_blocks = (len(prompt) - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert [cached for _, cached in results] == [0, 0, full_blocks, 0, full_blocks]
    assert results[1][0] == results[2][0], "a cached adapter prefix gives the adapter's own output"

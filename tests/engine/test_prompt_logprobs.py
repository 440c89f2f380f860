"""``echo`` with ``logprobs`` and vLLM's ``prompt_logprobs`` on the real engine (bundled SmolLM2,
float32): the prompt's token logprobs equal transformers' on the same weights."""

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from engine.model.loader import load_model
from normalize.chat_tokenizer import ChatTokenizer
from normalize.model_files import resolve_model
from tests.procs import ManagedProcess

torch.set_num_threads(2)

MODEL = "smollm2-135m"
PROMPT = "Question: What is the capital of France?\nAnswer: The capital of France is Paris."

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(real_engines: list[ManagedProcess]) -> ManagedProcess:
    return real_engines[0]


@pytest.fixture(scope="module")
def client(engine: ManagedProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{engine.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer() -> ChatTokenizer:
    return ChatTokenizer.load(MODEL)


@pytest.fixture(scope="module")
@torch.inference_mode()
def expected(tokenizer: ChatTokenizer) -> torch.Tensor:
    """transformers' logprob of each prompt token after the first, given the tokens before it."""
    load_model(MODEL)
    reference: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
        resolve_model(MODEL).cache_dir / "hf", dtype=torch.float32, attn_implementation="sdpa"
    )
    ids = torch.tensor([tokenizer.encode_text(PROMPT)])
    logprobs = reference(ids).logits[0].float().log_softmax(dim=-1)
    return logprobs[:-1].gather(-1, ids[0, 1:, None])[:, 0]


def test_echo_with_max_tokens_0_scores_the_prompt_as_transformers_does(
    client: openai.OpenAI, tokenizer: ChatTokenizer, expected: torch.Tensor
) -> None:
    prompt_ids = tokenizer.encode_text(PROMPT)
    result = client.completions.create(model=MODEL, prompt=[prompt_ids], max_tokens=0, echo=True, logprobs=1)
    choice = result.choices[0]
    assert choice.text == PROMPT
    assert choice.finish_reason == "length"
    logprobs = choice.logprobs
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert len(logprobs.token_logprobs) == len(prompt_ids)
    assert logprobs.token_logprobs[1:] == pytest.approx(expected.tolist(), abs=1e-3)
    assert "".join(logprobs.tokens) == PROMPT
    assert logprobs.text_offset == [sum(len(token) for token in logprobs.tokens[:i]) for i in range(len(prompt_ids))]
    for token, logprob, top in zip(
        logprobs.tokens[1:], logprobs.token_logprobs[1:], logprobs.top_logprobs[1:], strict=True
    ):
        assert top[token] == logprob
        assert max(top.values()) >= logprob
    assert result.usage.prompt_tokens == len(prompt_ids) and result.usage.completion_tokens == 0


def test_echo_with_generation_appends_the_generated_tokens(client: openai.OpenAI, expected: torch.Tensor) -> None:
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=2)
    echoed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=2, echo=True)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    logprobs = echoed.choices[0].logprobs
    num_prompt = echoed.usage.prompt_tokens
    assert logprobs.token_logprobs[1:num_prompt] == pytest.approx(expected.tolist(), abs=1e-3)
    assert logprobs.token_logprobs[num_prompt:] == pytest.approx(plain.choices[0].logprobs.token_logprobs, abs=1e-4)
    assert logprobs.text_offset[num_prompt] == len(PROMPT)


def test_vllm_prompt_logprobs_name_token_ids_with_rank(
    engine: ManagedProcess, tokenizer: ChatTokenizer, expected: torch.Tensor
) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2}
    choice = httpx.post(f"{engine.url}/v1/completions", json=body, timeout=60).json()["choices"][0]
    entries = choice["prompt_logprobs"]
    prompt_ids = tokenizer.encode_text(PROMPT)
    assert entries[0] is None and len(entries) == len(prompt_ids)
    for token_id, entry, want in zip(prompt_ids[1:], entries[1:], expected.tolist(), strict=True):
        own = entry[str(token_id)]
        assert own["logprob"] == pytest.approx(want, abs=1e-3)
        assert own["decoded_token"] == tokenizer.decode([token_id], skip_special_tokens=False)
        ranked = sorted(entry.values(), key=lambda item: item["rank"])
        assert ranked[0]["rank"] == 1 and ranked[0]["logprob"] >= own["logprob"]
        assert len(entry) in (2, 3)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"echo": True, "logprobs": 1, "stream": True}, "echo"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
    ],
)
def test_unservable_scoring_requests_get_a_400_naming_the_field(
    engine: ManagedProcess, extra: dict, param: str
) -> None:
    response = httpx.post(f"{engine.url}/v1/completions", json={"model": MODEL, "prompt": PROMPT, **extra}, timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


def test_chat_prompt_logprobs_is_refused_not_ignored(engine: ManagedProcess) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "prompt_logprobs": 1}
    response = httpx.post(f"{engine.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "prompt_logprobs"

"""kvgate's gateway in front of a real vLLM: requests pass, cached tokens pass, KV events arrive.

Starts vLLM (CPU, KV events over ZMQ) and a kvgate gateway whose one backend is that vLLM, with
the converted model folder as tokenizer and kvgate's 16-token blocks. Then checks, printing one
line per check: chat and completions, streamed and not, answer through the gateway;
``usage.prompt_tokens_details.cached_tokens`` comes back; the gateway receives vLLM's KV event
batches; and, for prompts sharing a prefix, what the router predicted cached
(``x-kvgate-predicted-cached-tokens``) must equal what vLLM reports. vLLM's CPU blocks hold 128
tokens, so it reports hits in multiples of 128; the router learns that block size from vLLM's
``BlockStored`` events and rounds its 16-token matches down to it. Last, distinct prompts
overflow vLLM's KV cache and its removals must reach the router's index. Exits 1 if a check fails.

    python -m bench.peers.vllm_gateway_check [--dtype float32]
"""

import argparse
import random
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.processes import Process, free_port, http_body, kvgate_command, launch, wait_ready
from bench.peers.vllm_peer import VllmOptions, require_vllm, running_vllm, vllm_options_on_free_ports

BACKEND = "vllm"
KVGATE_BLOCK_SIZE = 16
VLLM_CPU_BLOCK_SIZE = 128
EVICTION_PROMPT_TOKENS = 3000


@dataclass
class Reply:
    """A gateway answer: headers, and the JSON body or the stream's chunks merged."""

    headers: dict[str, str]
    text: str
    usage: dict[str, Any]

    @property
    def cached_tokens(self) -> int:
        return (self.usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0

    @property
    def predicted_cached_tokens(self) -> int:
        return int(self.headers.get("x-kvgate-predicted-cached-tokens", "-1"))


def post(url: str, body: dict[str, Any]) -> Reply:
    """POST an OpenAI request; a streamed answer is read to its end and merged."""
    request = urllib.request.Request(url, data=orjson.dumps(body), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        headers = {name.lower(): value for name, value in response.headers.items()}
        if not body.get("stream"):
            document = orjson.loads(response.read())
            choice = document["choices"][0]
            return Reply(headers, choice.get("text") or choice["message"]["content"], document.get("usage") or {})
        pieces: list[str] = []
        usage: dict[str, Any] = {}
        for line in response:
            payload = line.removeprefix(b"data:").strip()
            if not line.startswith(b"data:") or payload == b"[DONE]":
                continue
            chunk = orjson.loads(payload)
            for choice in chunk.get("choices") or ():
                pieces.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
            usage = chunk.get("usage") or usage
        return Reply(headers, "".join(pieces), usage)


def metric_samples(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Samples ``(labels, value)`` named ``name`` in a Prometheus text page."""
    body = http_body(url)
    if body is None:
        return []
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == name
    ]


def vllm_capacity_blocks(vllm_url: str) -> int:
    """vLLM's KV cache in kvgate blocks, from its ``vllm:cache_config_info`` labels."""
    labels, _ = metric_samples(f"{vllm_url}/metrics", "vllm:cache_config_info")[0]
    return int(labels["num_gpu_blocks"]) * int(labels["block_size"]) // KVGATE_BLOCK_SIZE


@contextmanager
def running_gateway(vllm: Process, options: VllmOptions, log_dir: Path) -> Iterator[Process]:
    port = free_port()
    config = {
        "listen": {"host": "127.0.0.1", "port": port},
        "model": options.served_model_name,
        "tokenizer": str(options.model_dir),
        "block_size": KVGATE_BLOCK_SIZE,
        "backends": [{
            "name": BACKEND,
            "url": vllm.url,
            "kv_events": f"tcp://127.0.0.1:{options.kv_events_port}",
            "kv_capacity_blocks": vllm_capacity_blocks(vllm.url),
        }],
        "routing": {"policy": "cache_aware"},
    }  # fmt: skip
    config_path = log_dir / "kvgate-vllm.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    gateway = launch(kvgate_command("gateway", "-c", str(config_path)), port, log_dir / "kvgate-gateway.log")
    try:
        wait_ready(
            gateway,
            lambda: BACKEND in orjson.loads(http_body(f"{gateway.url}/health") or b"{}").get("healthy_backends", []),
        )
        yield gateway
    finally:
        gateway.stop()


class Checklist:
    def __init__(self) -> None:
        self.failures = 0

    def check(self, ok: bool, what: str, detail: str = "") -> None:
        self.failures += not ok
        print(f"[{'ok' if ok else 'FAIL'}] {what}" + (f": {detail}" if detail else ""))


def check_endpoints(gateway: str, model: str, checks: Checklist) -> None:
    """Chat and completions, streamed and not, answer through the gateway from the vLLM backend."""
    chat = {
        "model": model,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 12,
        "temperature": 0,
    }
    completion = {"model": model, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", completion)):
        for stream in (False, True):
            extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
            reply = post(gateway + path, {**body, **extra})
            served_by = reply.headers.get("x-kvgate-backend")
            checks.check(
                bool(reply.text) and served_by == BACKEND and reply.usage.get("completion_tokens", 0) > 0,
                f"{path} stream={stream}",
                f"{reply.text!r} via {served_by}, usage {reply.usage.get('prompt_tokens')}+{reply.usage.get('completion_tokens')}",
            )


def prompt_pair(rng: random.Random, shared: int, first_length: int) -> tuple[list[int], list[int]]:
    """Two token-id prompts with exactly ``shared`` leading tokens in common (the second 64 longer)."""
    prefix = [rng.randrange(1000, 40000) for _ in range(shared)]
    first = prefix + [rng.randrange(1000, 40000) for _ in range(first_length - shared)]
    return first, prefix + [rng.randrange(1000, 40000) for _ in range(64)]


def check_prefix_hits(gateway: str, model: str, checks: Checklist) -> list[tuple[str, int, int]]:
    """Prompts sharing prefixes of several lengths: cached tokens pass through; predicted vs reported."""
    rng = random.Random(7)
    rows: list[tuple[str, int, int]] = []
    for shared, first_length in ((896, 1000), (1000, 1100), (1024, 1100)):
        for stream in (False, True):
            first, second = prompt_pair(rng, shared, first_length)
            extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
            post(
                gateway + "/v1/completions",
                {"model": model, "prompt": first, "max_tokens": 2, "temperature": 0, **extra},
            )
            time.sleep(0.5)
            reply = post(
                gateway + "/v1/completions",
                {"model": model, "prompt": second, "max_tokens": 2, "temperature": 0, **extra},
            )
            label = f"{shared} shared tokens (first prompt {first_length}), stream={stream}"
            expected = shared // VLLM_CPU_BLOCK_SIZE * VLLM_CPU_BLOCK_SIZE
            checks.check(
                reply.cached_tokens == expected,
                f"cached_tokens through the gateway, {label}",
                f"{reply.cached_tokens}, expected {expected}",
            )
            check_prediction(reply, label, checks)
            rows.append((label, reply.predicted_cached_tokens, reply.cached_tokens))
    return rows


def check_prediction(reply: Reply, label: str, checks: Checklist) -> None:
    """The router's predicted cached tokens equal the ones vLLM reports."""
    checks.check(
        reply.predicted_cached_tokens == reply.cached_tokens,
        f"predicted == reported cached tokens, {label}",
        f"predicted {reply.predicted_cached_tokens}, reported {reply.cached_tokens}",
    )


def check_chat_prefix(gateway: str, model: str, checks: Checklist) -> tuple[str, int, int]:
    """Two chats with one long system prompt: the router's own tokenization must match vLLM's."""
    system = " ".join(f"Rule {number}: answer politely and cite source {number * 7}." for number in range(120))
    replies = [
        post(gateway + "/v1/chat/completions", {"model": model, "max_tokens": 4, "temperature": 0, "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": question}]})
        for question in ("What is rule 3?", "Which source does rule 5 cite?")
    ]  # fmt: skip
    second = replies[1]
    checks.check(
        second.cached_tokens > 0,
        "chat with a shared system prompt: cached_tokens through the gateway",
        str(second.cached_tokens),
    )
    label = f"chat, {second.usage.get('prompt_tokens')}-token prompt, shared system prompt"
    check_prediction(second, label, checks)
    return label, second.predicted_cached_tokens, second.cached_tokens


def check_kv_events(gateway: str, vllm: str, checks: Checklist) -> None:
    samples = metric_samples(f"{gateway}/metrics", "kvgate_kv_event_batches_total")
    batches = sum(value for labels, value in samples if labels.get("backend") == BACKEND)
    checks.check(
        batches > 0, "gateway received vLLM KV event batches (kvgate_kv_event_batches_total)", f"{batches:.0f}"
    )
    print(f"  router prefix index (/dashboard/stats.json): {orjson.dumps(prefix_index(gateway)).decode()}")
    hits = metric_samples(f"{vllm}/metrics", "vllm:prefix_cache_hits_total")
    queries = metric_samples(f"{vllm}/metrics", "vllm:prefix_cache_queries_total")
    print(f"  vLLM prefix cache: hits {sum(v for _, v in hits):.0f} of {sum(v for _, v in queries):.0f} queried tokens")


def prefix_index(gateway: str) -> dict[str, Any]:
    return orjson.loads(http_body(f"{gateway}/dashboard/stats.json") or b"{}")["prefix_index"]["index"]


def check_evictions(gateway: str, vllm: str, model: str, checks: Checklist) -> None:
    """Overflow vLLM's KV cache with distinct prompts: its removals reach the router's index."""
    capacity = vllm_capacity_blocks(vllm)
    rng = random.Random(11)
    for _ in range(capacity * KVGATE_BLOCK_SIZE // EVICTION_PROMPT_TOKENS + 2):
        prompt = [rng.randrange(1000, 40000) for _ in range(EVICTION_PROMPT_TOKENS)]
        post(gateway + "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0})
    time.sleep(0.5)
    index = prefix_index(gateway)
    counters = index["kv_events"][BACKEND]["ingest"]
    held = index["per_replica"][BACKEND]["blocks"]
    checks.check(
        counters["blocks_removed"] > 0 and counters["unknown_removals"] == 0 and held <= capacity,
        "vLLM evictions reach the router's index",
        f"{counters['blocks_removed']} kvgate blocks removed, {counters['unknown_removals']} unknown removals, "
        f"index holds {held} of vLLM's {capacity} blocks",
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args(argv)
    options = vllm_options_on_free_ports(VllmOptions(dtype=args.dtype), with_kv_events=True)
    require_vllm(options)
    checks = Checklist()
    with tempfile.TemporaryDirectory() as folder:
        log_dir = Path(folder)
        with running_vllm(options, log_dir) as vllm, running_gateway(vllm, options, log_dir) as gateway:
            model = options.served_model_name
            check_endpoints(gateway.url, model, checks)
            rows = [*check_prefix_hits(gateway.url, model, checks), check_chat_prefix(gateway.url, model, checks)]
            check_kv_events(gateway.url, vllm.url, checks)
            check_evictions(gateway.url, vllm.url, model, checks)
            print(f"\n{'second request':<62}{'predicted':>10}{'reported':>10}")
            for label, predicted, reported in rows:
                print(f"{label:<62}{predicted:>10}{reported:>10}")
            if checks.failures:
                print(f"\ngateway log tail:\n{gateway.log_tail()}")
    sys.exit(1 if checks.failures else 0)


if __name__ == "__main__":
    main()

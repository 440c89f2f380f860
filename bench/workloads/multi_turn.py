"""Multi-turn chat sessions: each user's turn resends the whole growing history.

Every user shares one system prompt of ``system_prompt_len`` tokens; turn ``k`` sends the system
prompt, all earlier user messages and assistant answers, and a new user message. Assistant answers
are fixed synthetic tokens of ``answer_len`` (not the model's output), so the history is known in
advance and identical for every contender. Users start as a Poisson process at ``user_rate``;
each next turn starts ``think_s`` after the previous one finished, or, with ``think_jitter_s``, a
time drawn uniformly within that much of ``think_s`` (a draw of its own per turn, the same for
every contender). With one think time and one answer length, users whose turns once meet on a
replica finish in the same decode step and meet again every turn after: a lock-step no person
keeps, which the jitter removes (bench/notes/2026-12-05-multi-turn-lock-step.md).
"""

import random
from collections.abc import Sequence
from dataclasses import dataclass

from bench.workloads.token_blocks import DEFAULT_VOCAB, poisson_arrivals, random_tokens
from bench.workloads.types import BenchRequest


@dataclass(frozen=True)
class MultiTurnParams:
    num_users: int = 64
    turns: int = 8
    system_prompt_len: int = 512
    user_message_len: int = 96
    answer_len: int = 64
    output_len: int = 16
    user_rate: float = 6.0
    """New users per second (Poisson)."""
    think_s: float = 0.5
    think_jitter_s: float = 0.0
    seed: int = 0


def generate(params: MultiTurnParams, vocab: Sequence[int] = DEFAULT_VOCAB) -> list[BenchRequest]:
    rng = random.Random(params.seed)
    thinking = random.Random(f"think-{params.seed}")  # its own draws: the prompts stay the seed's
    system_prompt = random_tokens(rng, params.system_prompt_len, vocab)
    starts = poisson_arrivals(rng, params.num_users, params.user_rate)
    requests = []
    for user, start in enumerate(starts):
        history = system_prompt
        for turn in range(params.turns):
            history += random_tokens(rng, params.user_message_len, vocab)
            requests.append(
                BenchRequest(
                    request_id=f"mt-{user}-{turn}",
                    session_id=f"user-{user}",
                    arrival_s=start + turn * params.think_s,
                    max_tokens=params.output_len,
                    prompt_ids=history,
                    user=f"user-{user}",
                    think_s=_think_s(params, thinking) if turn else 0.0,
                    group=f"user-{user}",
                )
            )
            history += random_tokens(rng, params.answer_len, vocab)
    return sorted(requests, key=lambda request: request.arrival_s)


def _think_s(params: MultiTurnParams, thinking: random.Random) -> float:
    if not params.think_jitter_s:
        return params.think_s
    return max(params.think_s + thinking.uniform(-params.think_jitter_s, params.think_jitter_s), 0.0)

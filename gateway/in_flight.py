"""A placed request from the moment it goes to its replica until it ends: the bookkeeping every
driver settles the same way.

Entering takes the replica's slot, its KV reservation and its queued prefill (``Backend.occupy``);
``sent`` tells the router where the request went (its index insert), ``first_token`` ends its queued
prefill, ``finish`` frees the replica and calibrates (or undoes) the router's prediction. The
gateway's dispatcher (gateway/dispatch.py) and ``kvgate bench simulate`` (bench/sim/simulate.py) both
settle a request through this class; waking whoever waits for room is the driver's own.
"""

from typing import TypeVar

from gateway.backends.pool import Backend
from gateway.routing.placement import Placement
from gateway.routing.router import Router

BackendT = TypeVar("BackendT", bound=Backend)


class InFlight:
    def __init__(self, router: Router, placement: Placement[BackendT], prefill_tokens: int) -> None:
        self._router = router
        self._ticket = placement.ticket
        self._backend = placement.backend.name
        waiting_tokens = placement.ticket.request.prompt_tokens if prefill_tokens else 0
        self._occupancy = placement.backend.occupy(prefill_tokens, placement.kv_blocks, waiting_tokens)
        self._prefill_done = self._occupancy.__enter__()
        self._finished = False

    def load_mark_header(self) -> dict[str, str]:
        """The header that tells the replica's load reports which of this gateway's requests they count."""
        return self._occupancy.load_mark.header()

    def sent(self) -> None:
        """The request was written to its replica (once per ticket; later calls do nothing)."""
        self._router.on_routed(self._ticket, self._backend)

    def add_prefill(self, tokens: int) -> None:
        """The replica prefills ``tokens`` more of the prompt than the request was placed with (its
        prefill leg elsewhere failed): queued work there until its first token."""
        self._occupancy.add_prefill(tokens)

    def first_token(self) -> None:
        """The replica has prefilled the prompt: it is no longer queued work there."""
        self._prefill_done()

    def finish(self, cached_tokens: int | None, prefilled: bool, completed_output_tokens: int | None = None) -> None:
        """The request ended, ``prefilled`` on its replica (with the replica's ``cached_tokens`` when
        it reported them) or not, and ``completed_output_tokens`` long when the replica finished the
        answer; a second call does nothing."""
        if self._finished:
            return
        self._finished = True
        self._occupancy.__exit__(None, None, None)
        self.sent()
        self._router.on_finished(self._ticket, cached_tokens, prefilled, completed_output_tokens)

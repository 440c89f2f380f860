"""Whose fault is a replica's 5xx answer: the replica's, or the request's?

A replica that answers an HTTP 5xx is up; what failed may be the request itself (content the
engine chokes on). Counting such an answer against the replica's circuit breaker would let one
client eject every replica with a few bad requests. So a 5xx answer is held back: the request is
retried on another replica once, and only if another replica then serves it is the first one's
failure recorded (the fault was the replica's). If a second replica answers 5xx as well, the fault
is the request's: no breaker counts it, no further replica is tried, and the client gets the
error. A replica that cannot be reached or times out is not an answer; the dispatcher counts that
at once as before.
"""

from dataclasses import dataclass, field

from gateway.backends.pool import Backend
from gateway.backends.proxy import UpstreamAnswered
from gateway.errors import OpenAIError


@dataclass
class AnsweredErrors:
    """One request's 5xx answers, not yet counted against the replicas that gave them."""

    _answers: list[tuple[Backend, UpstreamAnswered]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self._answers)

    def add(self, backend: Backend, answer: UpstreamAnswered) -> None:
        """Hold ``answer`` back; raise the client's error when another replica already answered 5xx."""
        self._answers.append((backend, answer))
        if len({held.name for held, _ in self._answers}) > 1:
            raise self.client_error()

    def served_elsewhere(self) -> None:
        """The request succeeded on another replica: the ones that answered 5xx were at fault."""
        for backend, _ in self._answers:
            backend.breaker.record_failure()
        self._answers.clear()

    def client_error(self) -> OpenAIError:
        """What the client gets when no replica served the request after a 5xx answer."""
        names = " and ".join(f"'{backend.name}'" for backend, _ in self._answers)
        backend, last = self._answers[-1]
        if len(self._answers) > 1:
            why = (
                f"Replicas {names} both answered {last.status} to this request, so its content is the likely cause; "
                "it was not retried further and no replica was marked unhealthy."
            )
        else:
            why = f"Replica {names} answered {last.status} to this request and no other replica could take it."
        return OpenAIError(502, f"{why} The backend said: {last.message}", type_="server_error", code="upstream_error")

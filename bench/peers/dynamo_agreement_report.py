"""What ``kvgate bench dynamo-agreement`` found: each decision of the real Dynamo router beside the
model's on the same state, why they differ where they do, and the summary table.

A disagreement is put down to the first of these that explains it:

- ``tie``: Dynamo's pick is among the workers the model rates lowest (the model drew another;
  both break ties at random);
- ``overlap-view``: the model's view of the caches (from the replicas' KV events) differed from
  Dynamo's at the decision, and on Dynamo's view the model rates Dynamo's pick lowest (event timing);
- ``cost``: neither, so a term of the model's cost differs from Dynamo's.
"""

from collections import Counter
from dataclasses import dataclass, field

from bench.sim.dynamo_model import lowest

AGREE, TIE, OVERLAP_VIEW, COST = "agree", "tie", "overlap-view", "cost"
LOGIT_TOLERANCE = 1e-6
SETTLE_S = 0.2
"""Longest wait, per decision, for the model's and Dynamo's views of the caches to agree."""
SHOWN_COST_DISAGREEMENTS = 10


@dataclass
class Decision:
    index: int
    """Position in the window (the order decisions were taken in)."""
    selection_id: str
    prompt_tokens: int
    real: str
    """The worker Dynamo's select_service picked."""
    model: str
    """The worker the model picked (a random one of ``tied`` where several cost the same)."""
    costs: dict[str, float]
    """The model's cost per worker on its own view of the caches."""
    costs_on_dynamo_view: dict[str, float]
    """The same, on the overlap Dynamo reported."""
    model_overlap: dict[str, int]
    dynamo_overlap: dict[str, int]
    """Blocks per worker from Dynamo's ``/overlap_scores`` just before it decided."""
    prefill_tokens: tuple[int, int] = (0, 0)
    """The reservation's prefill tokens as the model counts them on its own view (``route``) and as
    Dynamo did (``effective_prefill_tokens``); the model records Dynamo's."""
    overlap_polls: int = 1
    """Times ``/overlap_scores`` was asked before the views agreed (1: they agreed at first look)."""
    dynamo_logit: float | None = None
    """The cost Dynamo logged for its pick (its ``Selected worker ... logit=`` line)."""
    cached_tokens: int | None = None
    error: str | None = None

    @property
    def tied(self) -> list[str]:
        return lowest(self.costs)

    @property
    def cause(self) -> str:
        if self.model == self.real:
            return AGREE
        if self.real in self.tied:
            return TIE
        if self.model_overlap != self.dynamo_overlap and self.real in lowest(self.costs_on_dynamo_view):
            return OVERLAP_VIEW
        return COST

    @property
    def logit_matches(self) -> bool | None:
        """Whether the model's cost of Dynamo's pick (on Dynamo's view) is the cost Dynamo logged."""
        if self.dynamo_logit is None:
            return None
        return abs(self.costs_on_dynamo_view[self.real] - self.dynamo_logit) <= LOGIT_TOLERANCE


@dataclass
class AgreementSummary:
    title: str
    workers: list[str]
    decisions: list[Decision]
    lost_event_batches: int = 0
    """Batches the model's event subscription missed (sequence gaps); 0 in a clean run."""
    notes: list[str] = field(default_factory=list)

    def count(self, cause: str) -> int:
        return sum(1 for decision in self.decisions if decision.cause == cause)

    @property
    def agreement(self) -> float:
        return self.count(AGREE) / len(self.decisions) if self.decisions else 0.0

    @property
    def agreement_excluding_ties(self) -> float:
        """Exact agreement over the decisions that are not a tie drawn differently."""
        counted = len(self.decisions) - self.count(TIE)
        return self.count(AGREE) / counted if counted else 1.0

    @property
    def overlap_agreement(self) -> float:
        """The share of (request, worker) pairs where the model's overlap blocks equal Dynamo's."""
        pairs = [(d.model_overlap[w], d.dynamo_overlap[w]) for d in self.decisions for w in self.workers]
        return sum(1 for mine, theirs in pairs if mine == theirs) / len(pairs) if pairs else 1.0

    @property
    def logit_checks(self) -> tuple[int, int]:
        """(matching, checked): decisions whose logged logit the model's cost reproduces."""
        checks = [d.logit_matches for d in self.decisions if d.logit_matches is not None]
        return sum(checks), len(checks)

    def markdown(self) -> str:
        total = len(self.decisions)
        counted = total - self.count(TIE)
        ties_present = sum(1 for d in self.decisions if len(d.tied) > 1)
        matching, checked = self.logit_checks
        waited = sum(1 for d in self.decisions if d.overlap_polls > 1)
        same_prefill = sum(1 for d in self.decisions if d.prefill_tokens[0] == d.prefill_tokens[1])
        prompt = sum(d.prompt_tokens for d in self.decisions if d.cached_tokens is not None)
        cached = sum(d.cached_tokens or 0 for d in self.decisions)
        rows = [
            ("decided", f"{total}", ""),
            ("model picks Dynamo's worker", f"{self.count(AGREE)}", f"{self.agreement:.1%}"),
            ("differ, Dynamo's pick among the model's tied-cost workers", *self._cause_cells(TIE)),
            ("differ, the overlap views differed (event timing)", *self._cause_cells(OVERLAP_VIEW)),
            ("differ, on cost", *self._cause_cells(COST)),
            (
                "**agreement excluding ties**",
                f"{self.count(AGREE)} of {counted}",
                f"**{self.agreement_excluding_ties:.1%}**",
            ),
            ("decisions where the model saw a tie", f"{ties_present}", _share(ties_present, total)),
            (
                "model's cost of Dynamo's pick = Dynamo's logged logit",
                f"{matching} of {checked}",
                _share(matching, checked),
            ),
            ("model's prefill tokens of the reservation = Dynamo's", f"{same_prefill}", _share(same_prefill, total)),
            (
                f"overlap views differed at first look (then waited up to {SETTLE_S} s)",
                f"{waited}",
                _share(waited, total),
            ),
            ("overlap blocks equal at the decision, per (request, worker)", "", f"{self.overlap_agreement:.1%}"),
            ("prompt tokens served from cache", f"{cached} of {prompt}", _share(cached, prompt)),
            ("KV event batches the model missed", f"{self.lost_event_batches}", ""),
        ]
        lines = [f"## {self.title}", "", "| | requests | share |", "|---|---|---|"]
        lines += [f"| {label} | {count} | {share} |" for label, count, share in rows]
        lines += [
            "",
            "| worker | Dynamo's picks | model's picks | overlap equal | mean abs overlap difference (blocks) |",
            "|---|---|---|---|---|",
        ]
        real, model = Counter(d.real for d in self.decisions), Counter(d.model for d in self.decisions)
        for worker in self.workers:
            differences = [abs(d.model_overlap[worker] - d.dynamo_overlap[worker]) for d in self.decisions]
            equal = sum(1 for difference in differences if difference == 0)
            mean = sum(differences) / len(differences) if differences else 0.0
            lines.append(
                f"| {worker} | {real[worker]} | {model[worker]} | {_share(equal, len(differences))} | {mean:.2f} |"
            )
        lines += self._cost_disagreements()
        lines += [f"- {note}" for note in self.notes]
        return "\n".join(lines) + "\n"

    def _cause_cells(self, cause: str) -> tuple[str, str]:
        return f"{self.count(cause)}", _share(self.count(cause), len(self.decisions))

    def _cost_disagreements(self) -> list[str]:
        shown = [d for d in self.decisions if d.cause == COST][:SHOWN_COST_DISAGREEMENTS]
        if not shown:
            return []
        lines = [
            "",
            "Cost disagreements (first few): model's costs per worker, on Dynamo's overlap view.",
            "",
            "| # | prompt tokens | Dynamo's pick (its logit) | model's pick | model's costs | overlap model / Dynamo |",
            "|---|---|---|---|---|---|",
        ]
        for d in shown:
            costs = ", ".join(f"{w} {d.costs_on_dynamo_view[w]:.2f}" for w in self.workers)
            overlaps = ", ".join(f"{d.model_overlap[w]}/{d.dynamo_overlap[w]}" for w in self.workers)
            lines.append(
                f"| {d.index} | {d.prompt_tokens} | {d.real} ({d.dynamo_logit}) | {d.model} | {costs} | {overlaps} |"
            )
        return lines


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "-"

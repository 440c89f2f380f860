"""How ``bench dynamo-agreement`` explains a disagreement, and what it reads from Dynamo's log and
the engines' events (the end-to-end run is tests/peers/test_dynamo_agreement.py)."""

from pathlib import Path

from bench.peers.dynamo_agreement import index_keys, logged_logits
from bench.peers.dynamo_agreement_report import AGREE, COST, OVERLAP_VIEW, TIE, AgreementSummary, Decision
from bench.sim.peer_kv_index import PeerKVIndex
from radix.hashing import block_hashes
from radix.kv_event_format import BlockStored, wire_block_hash


def decision(
    real: str,
    model: str,
    costs: dict[str, float],
    on_dynamo_view: dict[str, float] | None = None,
    model_overlap: dict[str, int] | None = None,
    dynamo_overlap: dict[str, int] | None = None,
) -> Decision:
    overlap = {"a": 0, "b": 0}
    return Decision(
        0, "s0", 64, real, model, costs, on_dynamo_view or costs, model_overlap or overlap, dynamo_overlap or overlap
    )


def test_each_disagreement_is_put_down_to_its_cause() -> None:
    assert decision("a", "a", {"a": 1.0, "b": 2.0}).cause == AGREE
    assert decision("a", "b", {"a": 1.0, "b": 1.0}).cause == TIE
    timing = decision("a", "b", {"a": 3.0, "b": 2.0}, {"a": 1.0, "b": 2.0}, {"a": 0, "b": 0}, {"a": 2, "b": 0})
    assert timing.cause == OVERLAP_VIEW, "on Dynamo's view of the caches the model picks as Dynamo did"
    assert decision("a", "b", {"a": 3.0, "b": 2.0}).cause == COST


def test_agreement_leaves_out_only_ties_drawn_differently() -> None:
    decisions = [
        decision("a", "a", {"a": 1.0, "b": 2.0}),
        decision("a", "b", {"a": 1.0, "b": 1.0}),
        decision("a", "b", {"a": 3.0, "b": 2.0}),
    ]
    summary = AgreementSummary("t", ["a", "b"], decisions)
    assert summary.agreement == 1 / 3
    assert summary.agreement_excluding_ties == 1 / 2
    assert "| differ, on cost | 1 | 33.3% |" in summary.markdown()


def test_the_logit_check_uses_the_cost_on_dynamos_view() -> None:
    def checked(logit: float | None) -> bool | None:
        picked = decision("a", "a", {"a": 5.0, "b": 6.0}, {"a": 4.5, "b": 6.0})
        picked.dynamo_logit = logit
        return picked.logit_matches

    assert checked(None) is None, "no logged line, nothing checked"
    assert checked(4.5) is True
    assert checked(5.0) is False


def test_dynamos_logged_picks_are_read_by_selection_id(tmp_path: Path) -> None:
    log = tmp_path / "select.log"
    log.write_text(
        "2026-12-01T21:21:33Z \x1b[32m INFO\x1b[0m dynamo_kv_router::scheduling::selector: Selected worker "
        'router_mode="kv" request_id="agree-7" worker_id=2 worker_type=decode dp_rank=0 logit=24.5 '
        "host_pinned_blocks=0 disk_blocks=0\n"
    )
    assert logged_logits(log) == {"agree-7": 24.5}


def test_the_engines_wire_hashes_match_the_models_queries() -> None:
    hashes = block_hashes(list(range(100, 164)), 16, "smollm2-135m")
    wire: list[bytes | int] = [wire_block_hash(h) for h in hashes[:3]]
    index = PeerKVIndex(["a"])
    index.apply("a", [index_keys(BlockStored(wire, None, list(range(100, 148)), 16))])
    assert index.prefix_blocks([wire_block_hash(h) for h in hashes]) == {"a": 3}

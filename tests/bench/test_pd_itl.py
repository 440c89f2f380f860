"""``kvgate bench pd-itl``'s requests and table (the run itself needs two real engines: bench/engine/pd_itl.py)."""

from bench.engine.pd_itl import build_parser, summary, workload
from bench.harness.loadgen import LoadResult, RequestResult


def test_the_workload_mixes_steady_short_requests_with_periodic_long_prompts() -> None:
    args = build_parser().parse_args(["--duration-s", "20", "--short-every-s", "1", "--long-every-s", "5"])
    requests = workload(args)
    shorts = [request for request in requests if request.group == "short"]
    longs = [request for request in requests if request.group == "long"]
    assert len(shorts) == 20 and len(longs) == 4
    assert [request.arrival_s for request in requests] == sorted(request.arrival_s for request in requests)
    assert {len(request.prompt_ids or ()) for request in longs} == {args.long_tokens}
    assert len({request.prompt_ids for request in requests}) == len(requests), "no prompt shares a prefix"
    assert workload(args) == requests, "the same requests for both fleets"


def test_the_table_row_reads_short_itl_and_counts_split_long_prompts() -> None:
    short = RequestResult("s", "short", 0.0, status=200, ttft_s=0.1, itl_s=[0.02, 0.04])
    split = RequestResult("l0", "long", 0.0, status=200, ttft_s=2.0, route_reason="prefix-hit pd=disaggregated")
    local = RequestResult("l1", "long", 0.0, status=200, ttft_s=3.0, route_reason="no-match pd=local-prefill-short")
    row = summary("P/D 1+1", LoadResult([short, split, local], 5.0))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[0] == "P/D 1+1" and cells[1] == "30" and cells[6] == "1/2" and cells[7] == "0"

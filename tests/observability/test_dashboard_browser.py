"""Headless Chromium opens /dashboard after traffic: charts drawn, breakers found, no console errors."""

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import openai
import orjson
import pytest

from tests.observability.cdp import Page, chromium_path, open_page
from tests.observability.deployment import MODEL, deployment

pytestmark = pytest.mark.skipif(
    chromium_path() is None,
    reason="headless Chromium is not installed (Debian: apt-get install chromium chromium-driver, or `make browser`)",
)

STABLE = "You are the assistant of a public library. Recommend books, check loans and opening hours. " * 12
PAGE_STATE = """window.Chart && Chart.getChart("chart-hit-rate") && JSON.stringify({
  ...document.body.dataset,
  hitRatePoints: Chart.getChart("chart-hit-rate").getDatasetMeta(0).data.length,
  firstBreaker: document.querySelector("#breakers tbody td.preview")?.textContent ?? null,
})"""


def send_traffic(url: str) -> None:
    """Requests whose system prompt starts with the current time (breakers), and some with a stable one (hits)."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    for turn in range(12):
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(1_790_000_000 + 7 * turn))
        system = f"Current time: {stamp}\n{STABLE}" if turn % 2 else STABLE
        messages = [{"role": "system", "content": system}, {"role": "user", "content": f"Is book {turn} in?"}]
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
        time.sleep(0.2)


async def wait_for_state(page: Page, ready: Callable[[dict], bool], timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        loaded = await page.evaluate(PAGE_STATE)
        state = orjson.loads(loaded) if loaded else {}
        if (state and ready(state)) or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.5)


async def test_dashboard_draws_hit_rate_and_prefix_breakers(tmp_path: Path) -> None:
    with deployment(tmp_path) as served:
        await asyncio.to_thread(send_traffic, served.url)
        async with open_page(tmp_path) as page:
            await page.send("Page.navigate", url=f"{served.url}/dashboard")
            state = await wait_for_state(page, lambda s: int(s.get("updates", 0)) >= 2 and s["hitRatePoints"] > 0)
            screenshot = tmp_path / "dashboard.png"
            await page.screenshot(screenshot)
    assert int(state["updates"]) >= 2, state
    assert int(state["hitPoints"]) > 0 and state["hitRatePoints"] > 0, state
    assert int(state["breakerRows"]) >= 1, state
    assert "Current time: " in state["firstBreaker"] and "⟦9" in state["firstBreaker"], state
    assert state["errors"] == "0" and page.console_errors == [], page.console_errors
    assert screenshot.stat().st_size > 20_000

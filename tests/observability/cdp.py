"""A headless Chromium driven over the Chrome DevTools Protocol (aiohttp websocket, no extra deps)."""

import asyncio
import base64
import itertools
import shutil
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import orjson

from tests.procs import ManagedProcess, free_port, start

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def chromium_path() -> str | None:
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


class Page:
    """One browser tab: send CDP commands, and collect console errors and exceptions as they come."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self.socket = socket
        self.console_errors: list[str] = []
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._reader = asyncio.create_task(self._read())

    async def send(self, method: str, **params: object) -> dict:
        command_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[command_id] = future
        await self.socket.send_str(orjson.dumps({"id": command_id, "method": method, "params": params}).decode())
        reply = await asyncio.wait_for(future, 30)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    async def evaluate(self, expression: str) -> object:
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    async def screenshot(self, path: Path) -> None:
        result = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(result["data"]))

    async def _read(self) -> None:
        async for message in self.socket:
            data = orjson.loads(message.data)
            if "id" in data:
                self._pending.pop(data["id"]).set_result(data)
            else:
                self._note_event(data["method"], data.get("params", {}))
        for future in self._pending.values():
            future.set_exception(ConnectionError("the browser closed the DevTools connection"))

    def _note_event(self, method: str, params: dict) -> None:
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            texts = (str(arg.get("value", arg.get("description"))) for arg in params["args"])
            self.console_errors.append(" ".join(texts))
        elif method == "Runtime.exceptionThrown":
            self.console_errors.append(str(params["exceptionDetails"].get("exception", {}).get("description")))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.console_errors.append(f"{params['entry'].get('url', '')}: {params['entry']['text']}")

    async def close(self) -> None:
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        await self.socket.close()


@asynccontextmanager
async def open_page(tmp_path: Path, width: int = 1366, height: int = 900) -> AsyncIterator[Page]:
    """Start headless Chromium (as root: --no-sandbox) and yield one tab with console capture on."""
    binary = chromium_path()
    assert binary is not None
    port = free_port()
    browser: ManagedProcess = start(
        [
            binary,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            f"--remote-debugging-port={port}",
            "--remote-debugging-address=127.0.0.1",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            f"--window-size={width},{height}",
            "about:blank",
        ],
        port,
        tmp_path / "chromium.log",
        ready_path="/json/version",
        timeout=60,
    )
    try:
        with urllib.request.urlopen(f"{browser.url}/json/list", timeout=5) as response:
            targets = orjson.loads(response.read())
        page_url = next(target["webSocketDebuggerUrl"] for target in targets if target["type"] == "page")
        async with aiohttp.ClientSession() as session:
            socket = await session.ws_connect(page_url, max_msg_size=0)
            page = Page(socket)
            try:
                for domain in ("Runtime", "Log", "Page"):
                    await page.send(f"{domain}.enable")
                yield page
            finally:
                await page.close()
    finally:
        browser.stop()

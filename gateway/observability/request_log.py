"""One structured JSON line per request, on the `kvgate.requests` logger.

Lines never carry prompt text unless `observability.log_content` is on in the config.

While the logger has only the gateway's own handler (no other handler, no filter, INFO enabled),
a line is written straight to that handler's stream, as its ``emit`` would write it: a
``LogRecord`` through ``Logger.info`` (caller lookup, process and thread names, locks, format)
cost ~40 us of CPU a request in the gateway process (bench/RESULTS.md, issue 12). Anything else
attached to the logger gets every line through ``logging`` as before.
"""

import contextlib
import logging
import sys
from pathlib import Path

import orjson

from gateway.observability.config import ObservabilityConfig

LOGGER_NAME = "kvgate.requests"

_MESSAGE_ONLY = logging.Formatter("%(message)s")


class RequestLog:
    def __init__(self, config: ObservabilityConfig) -> None:
        self.enabled = config.request_log
        self.log_content = config.log_content
        self.logger = logging.getLogger(LOGGER_NAME)
        self.handler: logging.Handler | None = None
        if self.enabled:
            self.handler = _handler(config.request_log_path)
            self.logger.addHandler(self.handler)
            self.logger.setLevel(logging.INFO)
            self.logger.propagate = False

    def write(self, fields: dict, body: dict | None = None) -> None:
        """Log one request; ``body`` (the prompt) is kept only when content logging is on."""
        if not self.enabled:
            return
        if self.log_content and body is not None:
            fields = {**fields, "body": body}
        line = orjson.dumps(fields, option=orjson.OPT_NON_STR_KEYS).decode()
        if not self._write_direct(line):
            self.logger.info(line)

    def _write_direct(self, line: str) -> bool:
        """Write ``line`` to the only handler's stream; False when logging must do it."""
        handler, logger = self.handler, self.logger
        if (
            not isinstance(handler, logging.StreamHandler)
            or logger.handlers != [handler]
            or logger.filters
            or handler.filters
            or handler.formatter is not _MESSAGE_ONLY
            or handler.level > logging.INFO
            or not logger.isEnabledFor(logging.INFO)
        ):
            return False
        try:
            with handler.lock or contextlib.nullcontext():
                handler.stream.write(line + handler.terminator)
                handler.stream.flush()
        except (OSError, ValueError):
            return False
        return True

    def close(self) -> None:
        if self.handler is not None:
            self.logger.removeHandler(self.handler)
            self.handler.close()


def _handler(path: str | None) -> logging.Handler:
    handler: logging.Handler
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path)
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_MESSAGE_ONLY)
    return handler

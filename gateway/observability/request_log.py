"""One structured JSON line per request, on the `kvgate.requests` logger.

Lines never carry prompt text unless `observability.log_content` is on in the config.
"""

import logging
import sys
from pathlib import Path

import orjson

from gateway.observability.config import ObservabilityConfig

LOGGER_NAME = "kvgate.requests"


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
        self.logger.info(orjson.dumps(fields, option=orjson.OPT_NON_STR_KEYS).decode())

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
    handler.setFormatter(logging.Formatter("%(message)s"))
    return handler

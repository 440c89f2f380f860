"""How the gateway runs as processes: the ``kvgate`` CLI, the supervisor that starts engines then
the gateway, the gateway server and its HTTP listener, the event loop and background threads, and
the multi-worker parent with its workers (``workers/``)."""

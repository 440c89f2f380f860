"""Micro-benchmarks of one gateway part: the prefix index, normalization, shared limits, the
stages of the request path, the gateway's added latency and throughput over a zero-latency
backend, the endpoint picker, Redis recovery, and a soak of the event loop. Each is a
``kvgate bench NAME`` subcommand."""

"""What runs a benchmark: the contenders and the child processes they run as, the load generator
(and wrk), the zero-latency backends, the offline hit-rate bounds, and the reports and tables a
run ends with. Every benchmark in ``bench/`` builds on these; none of them is a benchmark itself."""

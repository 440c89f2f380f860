"""The replicas behind the gateway: the pool with health checks, circuit breakers, and the proxy call."""

"""What the gateway shows about itself: Prometheus metrics, the dashboard, request logs, prefix breakers."""

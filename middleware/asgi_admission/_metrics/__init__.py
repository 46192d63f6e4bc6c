"""Prometheus metrics: the scrape-time collector, decision counters, and serving /metrics."""

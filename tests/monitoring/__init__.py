"""Monitoring assets: alert and recording rules, the Grafana dashboard."""

"""Logs and Prometheus metrics for every pdmesh process."""

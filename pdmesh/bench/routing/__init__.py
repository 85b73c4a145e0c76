"""Routing benchmarks: traffic where the prefix cache matters, a simulator of the router's
real policy and index at up to 1,000 workers, and the same traffic on a real mesh."""

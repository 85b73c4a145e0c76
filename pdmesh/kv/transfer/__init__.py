"""Moving KV blocks between workers (NIXL over UCX on CPU, RDMA / NVLink on GPU)."""

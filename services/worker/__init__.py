"""The runtime prefill and decode workers share: config, the Worker (engine + NIXL), server."""

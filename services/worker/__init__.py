"""The runtime prefill and decode workers share: config, engine + NIXL core, server."""

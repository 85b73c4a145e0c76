"""The shared prefix-cache index in Redis: workers publish, the router asks."""

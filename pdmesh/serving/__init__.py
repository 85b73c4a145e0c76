"""What the mesh's worker processes share: config, the engine + transport core, clients."""

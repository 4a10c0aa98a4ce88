"""Ground floor: errors and typed fields, the plugin registry, the config loader, run-dir
storage, client state, seeding and checkpoints. Loads no torch."""

"""Models the engine runs: the project's own small default model, or any local checkpoint."""

"""Federated continual learning: replay buffers, continual objectives, task metrics."""

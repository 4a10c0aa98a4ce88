"""Method-specific diagnostics drawn by ``fedray report`` when a run has their metrics."""

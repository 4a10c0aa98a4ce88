"""Server-side aggregation policies: pure numpy, no Ray, checkpointable state."""

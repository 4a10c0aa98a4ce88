"""Adapters of fedray's aggregation policies to other federated-learning frameworks.

Each submodule imports its framework itself (e.g. :mod:`fedray.integrations.flower` imports
``flwr``); importing this package imports none of them, and fedray does not depend on them.
"""

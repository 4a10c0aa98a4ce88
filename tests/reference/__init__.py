"""Plain-PyTorch references of fedray's methods: executable documentation and the oracles
``tests/test_references.py`` holds each method to, in both engine modes."""

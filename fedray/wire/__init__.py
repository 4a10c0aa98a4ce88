"""What crosses the wire: payloads and their codecs (exact bytes), compression maths and the
update-transform chain — the one home of compression. Ground floor; loads no torch."""

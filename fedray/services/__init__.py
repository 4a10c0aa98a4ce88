"""Simulation services any method or loop uses: the fleet (devices, availability, the
clock's formula), central differential privacy and its accountant, server optimizers.
Ground floor; loads no torch."""

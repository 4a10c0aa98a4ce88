"""Observation: Parquet metrics, experiment tracking, progress display, plots, console
output. Ground floor; loads no torch."""

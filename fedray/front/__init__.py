"""Front ends: the `fedray` CLI, Ray Tune sweeps and reports. They find methods through the
registry and name none."""

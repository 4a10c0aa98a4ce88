"""Federated class-incremental learning for the sub-model methods (DROD §3): the
``continual`` config section (:mod:`.section`), the task stream (:mod:`.data`), replay
buffers, the continual objectives (ER, DER++, BiC, EWC), task metrics and report plots."""

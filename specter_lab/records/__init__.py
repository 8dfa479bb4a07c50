"""A run's records: the per-op trace, the tally counted at every trace level, the metrics read from them, and the
trace-event export (Perfetto). Nothing here runs a model or knows a strategy."""

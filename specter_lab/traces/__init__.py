"""Routing as data: the recorded-routing file (:class:`~specter_lab.traces.trace_file.RoutingTrace`), the formats
other engines write, importing them, synthetic routing matched to published locality, and locality itself. No
torch: the bottom floor (recording a model and replaying strategies live above the runtime, in ``analysis/``)."""

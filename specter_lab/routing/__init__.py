"""Routing as data: the recorded-routing file (:class:`~specter_lab.routing.trace_file.RoutingTrace`), recording it
from a model, replaying strategies on it, importing routing from other engines, its locality, synthetic routing
matched to published curves, the cache simulator over a routing array, and the bounds."""

"""Analyses of recorded routing that drive the runtime: recording a model's routing (:mod:`.record`), replaying any
strategy on it (:mod:`.replay`), the clairvoyant bound (:mod:`.bound`), why a row is where it is (:mod:`.gap`) and
the cache bounds (:mod:`.cache_bounds`). Above ``run/``; below the estimate and the studies."""

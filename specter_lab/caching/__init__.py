"""Caches of experts as data: the eviction policies every cache of the package ranks with (:mod:`.policies`) and the
simulator of a cache over routing ids (:mod:`.simulate`). No torch: the bottom floor."""

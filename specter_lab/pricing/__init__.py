"""Pricing: hardware profiles, model cost shapes, the cost model, op counts of an experts implementation,
calibration of a GPU and a host, weight precisions, and the published rows the cost model is held to. Pricing never
imports the runtime (``offload/``): it sizes and times things, it does not move them."""

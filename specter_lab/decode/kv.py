"""The model's own cache for one sequence, and cutting it back after a draft window."""

from __future__ import annotations

import inspect

__all__ = ["SequenceCache"]


class SequenceCache:
    """The cache the model decodes with. ``kwarg`` is the name this transformers version's forward takes it by
    (5.x renames ``past_key_values`` to ``cache``)."""

    def __init__(self, model) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=model.config)
        # Sliding-window layers must keep their past until we crop, or a rejected draft cannot be rolled back.
        self.cache.activate_past_recording()
        params = inspect.signature(model.forward).parameters
        self.kwarg = "cache" if "cache" in params else "past_key_values"

    @property
    def length(self) -> int:
        """Tokens the cache holds."""
        return self.cache.get_seq_length()

    def crop_to(self, length: int) -> None:
        """Cut the cache back to ``length`` tokens (transformers ≥5 crops by a negative count to remove)."""
        extra = self.length - length
        if extra > 0:
            self.cache.crop(-extra)

"""The offloading runtime: where experts live (store), which stay (cache policies), and what time it is (clocks)."""

"""Standalone HTML reports (temporary shim: the viz split lands from the viz-browser branch)."""

from .figures import bench_html, report_html

__all__ = ["report_html", "bench_html"]

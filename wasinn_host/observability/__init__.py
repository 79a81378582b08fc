"""Logging (text or JSON lines) and Prometheus metrics, at the bottom of the package: anything may log
or export through it, and it imports nothing of the package (the status it exports is handed to it)."""

"""Status, Prometheus metrics and logging: read from the core, never from a front end's internals."""

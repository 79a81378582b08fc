"""The neutral core: parameters, configuration, the registry, the engine, the llama.cpp runtime
and inference contexts.  Nothing here knows an errno, a tensor index or guest memory; failures
are :class:`~wasinn_host.core.errors.WasiNNError` with an :class:`~wasinn_host.core.errors.ErrorKind`.
"""

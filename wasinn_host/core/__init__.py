"""The backend-neutral core: parameters and configuration, limits, the model registry, the scheduler
that batches every context of a model (:mod:`.scheduler`), inference contexts (:mod:`.inference`), the
prompt cache, chat templates, draft budgets, and the protocols a runtime implements (:mod:`.runtime`).

Nothing here knows an errno, a tensor index, guest memory or llama.cpp (its runtime is in
:mod:`wasinn_host.llama`, given to the registry by :mod:`wasinn_host.backend.local`); failures are
:class:`~wasinn_host.core.errors.WasiNNError` with an :class:`~wasinn_host.core.errors.ErrorKind`.
"""

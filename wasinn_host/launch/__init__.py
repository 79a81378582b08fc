"""Launching guests: compiling them (:mod:`.guest_load`, through the on-disk :mod:`.compile_cache`),
running one in a Store of its own (:mod:`.guest_run`, after :mod:`.import_check`), running N at once
with a deadline and Ctrl-C (:mod:`.runner`, stopping them through :mod:`.guest_stop`), and the
options a run is given in words (:mod:`.guest_options`).

What it runs against is the host (:class:`~wasinn_host.WasiNN`), which hands it linkers with the front
ends' imports; ``wasinn run`` and the ``wasinn_run`` pytest fixture both launch through here.
"""

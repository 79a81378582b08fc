"""``wasinn bench``: the host's serving speed on a user's own machine and model, against llama.cpp alone.

- :mod:`.guests`: N wasm guests answering at once through ``wasinn run --instances N --status``
  (the guest ``bench.wasm``, from ``guest_examples/bench.c``), computed or streamed;
- :mod:`.reference`: llama.cpp decoding as many sequences alone, with and without its sampler, in a
  process of its own (:mod:`.reference_process`);
- :mod:`.runner`: the runs, alternating both sides, and the default model;
- :mod:`.report`: medians and spread as a table or JSON; :mod:`.plot`: the SVG chart.

The command line is :mod:`wasinn_host.cli.bench`.
"""

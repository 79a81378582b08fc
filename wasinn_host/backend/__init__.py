"""Backends behind the front ends: the protocol (:mod:`.protocol`), this process's registry and
scheduler on llama.cpp (:mod:`.local`, with its :mod:`.status`), and a fake runtime for tests
(:mod:`.fake`, computing the successor model of :mod:`.successor`).  The gRPC client,
:class:`~wasinn_host.rpc.client.RemoteBackend`, is the third implementation of the protocol."""

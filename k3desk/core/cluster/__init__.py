"""Beyond one machine: cluster inventory over SSH, multi-node engines, remote endpoints.

- :mod:`~k3desk.core.cluster.nodes`: clusters and their nodes, persisted as JSON;
- :mod:`~k3desk.core.cluster.ssh`: the system ``ssh`` client, one-shot commands and
  supervised remote processes;
- :mod:`~k3desk.core.cluster.probe`: hardware and model-copy checks on each node;
- :mod:`~k3desk.core.cluster.plan`: per-node memory budgets and a cluster verdict;
- :mod:`~k3desk.core.cluster.sparkinfer`: SparkInfer TP3/TP4 (verified command line);
- :mod:`~k3desk.core.cluster.rpc`: llama.cpp RPC workers plus a local llama-server;
- :mod:`~k3desk.core.cluster.endpoints`: attached OpenAI-compatible servers.
"""

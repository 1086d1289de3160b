"""A cluster of engines behind a router: the replay that routes each arrival and steps the
replicas in time order (`group`), prefill/decode disaggregation's hand-offs over a link
(`handoffs`, `link`), replica failures (`outages`, `failover`), and the merged result
(`result`). One engine knows nothing of this package: a replica's own side of a hand-off
or a loss (`engine.replica_handoffs`, `engine.replica_loss`) is the engine's."""

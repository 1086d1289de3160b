"""A cluster of engines behind a router: the replay that routes each arrival and steps the
replicas in time order (`group`), prefill/decode disaggregation's hand-offs over a link
(`handoffs`, `link`), replica failures (`outages`, `failover`, and a replica's loss,
`replica_loss`, done through the engine's own primitives), and the merged result (`result`).
One engine knows nothing of this package: a replica's books of its hand-offs
(`replica_handoffs`) keep its parked requests through the engine's `Parking` protocol, and
a request that left a replica is `MOVED` there, whichever of this package's reasons moved it."""

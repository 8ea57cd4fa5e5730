"""Device ops, per-module placement (resident, offloaded, sharded) and stage-to-stage prefetch."""

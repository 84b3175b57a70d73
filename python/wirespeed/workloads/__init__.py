"""Real training workloads: model gradient shapes, DDP bucketing, aggregation strategies."""

"""Use cases joining store, engine, summarizers and telemetry; transport-agnostic."""

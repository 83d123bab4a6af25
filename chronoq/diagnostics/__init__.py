"""Looking inside a store: bulk task rows and the plans of the firing scan (lab, benchmarks)."""

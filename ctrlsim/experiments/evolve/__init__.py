"""The `evolve` protocol: config, units, report and the runner declaration."""

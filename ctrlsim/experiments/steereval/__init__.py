"""The `steereval` protocol: config, units, report and the runner declaration."""

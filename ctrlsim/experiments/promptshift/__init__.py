"""The `promptshift` protocol: config, units, report and the runner declaration."""

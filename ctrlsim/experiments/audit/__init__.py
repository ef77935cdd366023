"""The `audit` protocol: config, units, report and the runner declaration."""

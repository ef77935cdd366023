"""The `calibrate` protocol: config, units, report and the runner declaration."""

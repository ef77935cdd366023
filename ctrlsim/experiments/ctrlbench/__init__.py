"""The `ctrlbench` protocol: config, units, report and the runner declaration."""

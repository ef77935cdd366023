"""The `train_probe` protocol: config, units, report and the runner declaration."""

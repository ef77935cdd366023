"""Black boxes over HTTP: the client box, the contract, the exchange log, options, transport,
and `ctrlsim serve`."""

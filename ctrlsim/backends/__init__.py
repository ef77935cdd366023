"""Model backends: LLMs and text encoders behind one interface."""

"""Training: the Trainer (the protocol) and the concerns it delegates to."""

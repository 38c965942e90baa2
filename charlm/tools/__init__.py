"""Tools beside the main job: the benchmark against fused LSTM, and `charlm demo`."""

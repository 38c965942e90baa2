"""Using a trained model: exact static scoring, dynamic evaluation and its protocol, sampling."""

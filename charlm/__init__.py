"""charlm: character-level language modelling with recurrent networks."""

__version__ = "0.1.0"

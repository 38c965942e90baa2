"""`charlm prepare` and `charlm corpora`."""


def register(app):
    pass

"""Corpora: download, verify, split and encode the standard corpora (and your own text).

    from charlm.corpora import prepare_corpus, load_corpus
    corpus = prepare_corpus("wp", source="warpeace_input.txt")   # or load_corpus("wp") once prepared
    ids = corpus.split("train")                                   # memory-mapped token ids
    text = corpus.tokenizer.decode(ids[:100])

The names below load on first use: the recipes (``charlm.corpora.recipes``) and the data root
(``charlm.corpora.root``) are read without numpy or torch, for the command line's help and completion.
"""

from charlm.lazy import lazy_attribute

_EXPORTS = {
    "RECIPES": "charlm.corpora.recipes",
    "Recipe": "charlm.corpora.recipes",
    "CorpusEntry": "charlm.corpora.catalog",
    "get_recipe": "charlm.corpora.catalog",
    "list_corpora": "charlm.corpora.catalog",
    "load_corpus": "charlm.corpora.catalog",
    "DownloadPolicy": "charlm.corpora.download",
    "RemoteFile": "charlm.corpora.download",
    "prepare_corpus": "charlm.corpora.prepare",
    "PreparedCorpus": "charlm.corpora.store",
    "data_root": "charlm.corpora.root",
    "Tokenizer": "charlm.corpora.tokenizer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    return lazy_attribute(__name__, _EXPORTS, name)

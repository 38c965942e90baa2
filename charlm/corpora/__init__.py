"""Corpora: download, verify, split and encode the standard corpora (and your own text).

    from charlm.corpora import prepare_corpus, load_corpus
    corpus = prepare_corpus("wp", source="warpeace_input.txt")   # or load_corpus("wp") once prepared
    ids = corpus.split("train")                                   # memory-mapped token ids
    text = corpus.tokenizer.decode(ids[:100])
"""

from charlm.corpora.catalog import CorpusEntry, get_recipe, list_corpora, load_corpus
from charlm.corpora.download import DownloadPolicy, RemoteFile
from charlm.corpora.prepare import prepare_corpus
from charlm.corpora.recipes import RECIPES, Recipe
from charlm.corpora.store import PreparedCorpus, data_root
from charlm.corpora.tokenizer import Tokenizer

__all__ = [
    "RECIPES",
    "CorpusEntry",
    "DownloadPolicy",
    "PreparedCorpus",
    "Recipe",
    "RemoteFile",
    "Tokenizer",
    "data_root",
    "get_recipe",
    "list_corpora",
    "load_corpus",
    "prepare_corpus",
]

"""Sweeps over cells, budgets, corpora, fractions and seeds (plans), and reports that compare their runs."""

"""How a value reads in a one-line error: ``charlm.errors.shown`` and ``kind_of``."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from charlm.errors import kind_of, shown


def test_a_value_is_shown_as_its_repr_cut_to_a_width():
    assert shown("abc") == "'abc'" and shown(True) == "True" and shown(float("inf")) == "inf"
    assert shown("x" * 100, 20) == "'" + "x" * 16 + "..." and len(shown(list(range(1000)))) == 80


@pytest.mark.parametrize(
    "value, words",
    [
        ([1], "a list"),
        ((1,), "a list"),
        ("a", "text"),
        (True, "true or false"),
        (None, "null"),
        ({}, "a mapping"),
        (3, "a number"),
        (2.5, "a number"),
        (torch.zeros(2), "a tensor"),
        (torch.nn.Parameter(torch.zeros(1)), "a tensor"),
        (np.zeros(2), "an array"),
        (object(), "an object"),
    ],
)
def test_a_value_s_kind_in_words(value, words):
    assert kind_of(value) == words


def test_the_errors_module_does_not_import_torch():
    script = "import sys, charlm.errors; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", script], capture_output=True, text=True).stdout.strip() == "False"

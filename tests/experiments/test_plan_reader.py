"""The reader of plan files: every value of every point checked before anything trains, each failure
one line naming the plan file and the key path of the value at fault."""

from __future__ import annotations

import re

import pytest

from charlm.errors import CharlmError
from charlm.experiments.plan import load_plan, point_name
from charlm.experiments.plan_checks import key_path
from helpers import assert_one_line_error, cli

GOOD_AXES = '[axes]\ncell = ["gru"]\n'

BAD_PLANS = [  # (what, the plan's text, the message after "plan FILE: ")
    # the top level
    (
        "unknown key",
        '[axis]\ncell = ["gru"]\n',
        "unknown key 'axis' (did you mean 'axes'? a plan has axes, base, budget, description, eval, name, paper, "
        "paper_parameters, profiles, task)",
    ),
    ("base a number", "base = 3\n" + GOOD_AXES, "base must be a table of settings, not 3"),
    ("axes a list", "axes = [1]\n", "axes must be a table of axes (NAME = [values]), not [1]"),
    (
        "eval a table",
        "[eval]\nsplit = 'test'\n" + GOOD_AXES,
        "eval must be a list of tables ([[eval]]), not {'split': 'test'}",
    ),
    (
        "profiles a string",
        'profiles = "small"\n' + GOOD_AXES,
        "profiles must be a table of profiles ([profiles.NAME]), not 'small'",
    ),
    ("description a number", "description = 3\n" + GOOD_AXES, "description must be a string, not 3"),
    ("task a list", 'task = ["parity"]\n' + GOOD_AXES, "task must be a string, not ['parity']"),
    ("budget a number", "budget = 3\n" + GOOD_AXES, 'budget must be a label such as "0.9M per layer", not 3'),
    (
        "paper count negative",
        "[paper_parameters]\nlstm = -5\n" + GOOD_AXES,
        "paper_parameters.lstm must be a positive whole number, not -5",
    ),
    # a profile, checked whether or not it is chosen
    (
        "profile base a number",
        GOOD_AXES + "[profiles.small]\nbase = 3\n",
        "profiles.small.base must be a table of settings, not 3",
    ),
    (
        "profile a number",
        GOOD_AXES + "[profiles]\nsmall = 3\n",
        "profiles.small must be a table (axes, base, budget, eval), not 3",
    ),
    (
        "profile key misspelled",
        GOOD_AXES + "[profiles.small]\naxis = {}\n",
        "unknown key 'profiles.small.axis' (did you mean 'axes'? profiles.small has axes, base, budget, eval)",
    ),
    (
        "profile axis a number",
        GOOD_AXES + "[profiles.small]\naxes = { cell = 3 }\n",
        "profiles.small.axes.cell must be a non-empty list of values, not 3",
    ),
    (
        "profile eval step",
        GOOD_AXES + '[profiles.small]\neval = [{ split = "train" }]\n',
        "profiles.small.eval[0].split must be valid or test, not 'train'",
    ),
    (
        "profile name climbing",
        GOOD_AXES + '[profiles."../up"]\nbase = {}\n',
        "profile '../up' is not a plain name (letters, digits, '.', '_' and '-', starting with a letter or a digit, "
        "at most 200 characters)",
    ),
    # axes
    ("axis empty", "[axes]\ncell = []\n", "axes.cell must be a non-empty list of values, not []"),
    (
        "paired axis mixed",
        '[axes]\nmodel = [{ cell = "gru" }, 3]\n',
        "axes.model[1] must be a table of settings like the axis's other values, not 3",
    ),
    (
        "cell_options axis of numbers",
        "[axes]\ncell_options = [3]\n",
        "axes.cell_options[0] must be a table of cell options, not 3",
    ),
    (
        "base cell_options a number",
        "[base]\ncell_options = 3\n" + GOOD_AXES,
        "base.cell_options must be a table of cell options, not 3",
    ),
    # eval steps
    (
        "eval key misspelled",
        GOOD_AXES + "[[eval]]\nbatchsize = 4\n",
        "unknown key 'eval[0].batchsize' (did you mean 'batch_size'? eval[0] has adapt_on, batch_size, dynamic, split)",
    ),
    (
        "eval batch a string",
        GOOD_AXES + '[[eval]]\nbatch_size = "4"\n',
        "eval[0].batch_size must be a number, not '4'",
    ),
    ("eval batch zero", GOOD_AXES + "[[eval]]\nbatch_size = 0\n", "eval[0].batch_size must be at least 1, not 0"),
    (
        "eval adapt_on without dynamic",
        GOOD_AXES + '[[eval]]\nadapt_on = "valid"\n',
        'eval[0].adapt_on needs dynamic = "sgd" or "rms" (a static score adapts nothing)',
    ),
    # settings, and the points they make
    (
        "setting misspelled",
        "[base]\nbatchsize = 4\n" + GOOD_AXES,
        "base.batchsize: unknown setting 'batchsize' (did you mean 'batch_size'? any `charlm train` setting but "
        "data_dir, "
        "init_from, run_dir, or cell_options.NAME)",
    ),
    (
        "paired setting misspelled",
        '[axes]\nmodel = [{ cell = "gru", hiden = 8 }]\n',
        "axes.model[0].hiden: unknown setting 'hiden' (did you mean 'hidden_size'? any `charlm train` setting but "
        "data_dir, init_from, run_dir, or cell_options.NAME)",
    ),
    (
        "a path as a setting",
        '[base]\ndata_dir = "/elsewhere"\n' + GOOD_AXES,
        "base.data_dir: a plan cannot set 'data_dir' (a sweep chooses its run directories and init_from; the data, "
        "with --data-dir)",
    ),
    (
        "last point's value",
        "[axes]\nlayers = [1, 2, 2.5]\n",
        "axes.layers[2] must be an integer, not 2.5 (run layers-2.5)",
    ),
    (
        "a profile's value",
        GOOD_AXES + "[profiles.small]\nbase = { layers = 2.5 }\n",
        None,
    ),  # checked below, with --profile
    ("nan learning rate", "[axes]\nlr = [1e-3, nan]\n", "axes.lr[1] must be in (0, 1000], not nan (run lr-nan)"),
    (
        "cell option of the last point",
        '[axes]\ncell = ["lstm"]\n"cell_options.peephole" = ["full", "sideways"]\n',
        "axes.\"cell_options.peephole\"[1]: bad option for cell 'lstm': peephole must be one of none, diagonal, full, "
        "not 'sideways' (run cell-lstm_peephole-sideways)",
    ),
    (
        "cell option a paired axis gives",
        '[axes]\nmodel = [{ cell = "lstm", cell_options = { peephole = "x" } }]\n',
        "axes.model[0].cell_options.peephole: bad option for cell 'lstm': peephole must be one of none, diagonal, "
        "full, not 'x' (run model-lstm--peephole-x-)",
    ),
    (
        "budget not a number",
        '[axes]\nparams = ["1M", "lots"]\n',
        "axes.params[1]: parameter budget 'lots' is not a number like 1M, 2.5e6 or 800k (run params-lots)",
    ),
    (
        "corpus a path",
        '[axes]\ncorpus = ["../etc"]\n',
        "axes.corpus[0]: '../etc' is not a corpus name (a built-in corpus or a plain name) (run corpus-..-etc)",
    ),
    (
        "two points, one directory",
        '[axes]\nwandb_project = ["a/b", "a-b"]\n',
        "two runs would share the directory wandb_project-a-b ({'wandb_project': 'a/b'} and {'wandb_project': 'a-b'}): "
        "give each axis distinct values",
    ),
    (
        "a repeated value",
        '[axes]\ncell = ["gru", "gru"]\n',
        "two runs would share the directory cell-gru ({'cell': 'gru'} and {'cell': 'gru'}): give each axis "
        "distinct values",
    ),
    (
        "a grid too large to enumerate",
        "[axes]\n"
        + "".join(
            f"{axis} = [{', '.join(map(str, range(1, 30)))}]\n"
            for axis in (
                "seed",
                "hidden_size",
                "bptt",
                "batch_size",
                "epochs",
                "patience",
                "log_every",
                "eval_batch_size",
                "accumulate",
            )
        ),
        "its axes make 14,507,145,975,869 runs (29 x 29 x 29 x 29 x 29 x 29 x 29 x 29 x 29), more than the "
        "10,000 a sweep "
        "runs: split it into several plans",
    ),
    (
        "name climbing",
        'name = "../elsewhere"\n' + GOOD_AXES,
        "its name '../elsewhere' is not a plain name (letters, digits, '.', '_' and '-', starting with a letter or a "
        "digit, at most 200 characters)",
    ),
    ("name a list", 'name = ["x"]\n' + GOOD_AXES, "its name ['x'] is not a plain name"),
]


@pytest.mark.parametrize(
    "what, text, message", [case for case in BAD_PLANS if case[2]], ids=[case[0] for case in BAD_PLANS if case[2]]
)
def test_each_bad_plan_is_one_line_naming_the_file_and_the_key(what, text, message, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CharlmError) as raised:
        load_plan(path)
    assert str(raised.value).startswith(f"plan {path}: "), str(raised.value)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_profile_is_checked_chosen_or_not_and_named_in_the_path(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text(GOOD_AXES + "[profiles.small]\nbase = { layers = 2.5 }\n", encoding="utf-8")
    for chosen in ("small", None):  # the plan as written has no layers, but the file is checked whole
        with pytest.raises(
            CharlmError, match=r"profiles\.small\.base\.layers must be an integer, not 2\.5 \(run cell-gru\)$"
        ):
            load_plan(path, chosen)


def test_a_bad_value_in_the_last_point_stops_the_sweep_before_the_first_trains(tiny_corpus, tmp_path, monkeypatch):
    import charlm.training.trainer

    def never(*args, **kwargs):
        raise AssertionError("a point was trained")

    monkeypatch.setattr(charlm.training.trainer.Trainer, "__init__", never)
    plan = tmp_path / "late.toml"
    plan.write_text(
        '[base]\ncorpus = "tiny"\nhidden_size = 8\nepochs = 1\n[axes]\nlayers = [1, 2]\n'
        '"cell_options.peephole" = ["none", "sideways"]\ncell = ["lstm"]\n',
        encoding="utf-8",
    )
    result = cli("sweep", plan, "--dir", tmp_path / "sweep", "--data-dir", tiny_corpus)
    assert_one_line_error(
        result,
        f"plan {plan}: axes.\"cell_options.peephole\"[1]: bad option for cell 'lstm'",
        "(run layers-1_peephole-sideways_cell-lstm)",
    )  # the first point with it: the second of four
    assert not (tmp_path / "sweep").exists()


def test_more_eval_streams_than_a_prepared_split_is_refused_before_anything_is_written(tiny_corpus, tmp_path):
    from charlm.corpora import load_corpus

    predictions = len(load_corpus("tiny", tiny_corpus).split("valid")) - 1
    plan = tmp_path / "wide.toml"
    plan.write_text(
        f'[base]\ncorpus = "tiny"\nhidden_size = 8\n[axes]\ncell = ["gru"]\n[[eval]]\nsplit = "valid"\n'
        f"batch_size = {predictions + 1}\n",
        encoding="utf-8",
    )
    for extra in ((), ("--dry-run",)):
        result = cli("sweep", plan, "--dir", tmp_path / "sweep", "--data-dir", tiny_corpus, *extra)
        assert_one_line_error(
            result,
            f"plan {plan}: eval[0].batch_size is {predictions + 1:,}, more streams than the "
            f"{predictions:,} predictions of the valid split of 'tiny': give at most {predictions:,}",
        )
        assert not (tmp_path / "sweep").exists()
    plan.write_text(
        plan.read_text()
        .replace(f"batch_size = {predictions + 1}", "batch_size = 4")
        .replace("hidden_size = 8", "hidden_size = 8\neval_batch_size = 100000")
    )
    assert_one_line_error(
        cli("sweep", plan, "--dir", tmp_path / "sweep", "--data-dir", tiny_corpus),
        f"plan {plan}: base.eval_batch_size is 100,000, more streams than the",
    )
    dynamic = tmp_path / "dynamic.toml"  # a dynamic step (#2 adapts on valid first) is checked as widely
    dynamic.write_text(
        '[base]\ncorpus = "tiny"\nhidden_size = 8\n[axes]\ncell = ["gru"]\n[[eval]]\nsplit = "valid"\n'
        '[[eval]]\nsplit = "test"\ndynamic = "sgd"\nadapt_on = "valid"\nbatch_size = 100000\n',
        encoding="utf-8",
    )
    assert_one_line_error(
        cli("sweep", dynamic, "--dir", tmp_path / "sweep", "--data-dir", tiny_corpus),
        f"plan {dynamic}: eval[1].batch_size is 100,000, more streams than the",
    )
    assert not (tmp_path / "sweep").exists()


def test_key_paths_quote_keys_a_bare_toml_key_cannot_spell():
    assert key_path("axes", "cell_options.peephole", 1) == 'axes."cell_options.peephole"[1]'
    assert key_path("profiles", "small", "base", "lr") == "profiles.small.base.lr"
    assert key_path("", "my key") == '"my key"'


def test_a_run_directory_name_stays_within_a_file_names_length_and_unique():
    long_a, long_b = {"wandb_project": "x" * 300 + "a"}, {"wandb_project": "x" * 300 + "b"}
    name_a, name_b = point_name(long_a), point_name(long_b)
    assert len(name_a) == len(name_b) == 200 and name_a != name_b
    assert name_a[:183] == name_b[:183] == ("wandb_project-" + "x" * 300)[:183]
    assert point_name({"cell": "gru", "lr": 0.001}) == "cell-gru_lr-0.001"  # short names are as before


def test_a_paired_axis_cell_options_merge_with_the_base_ones(tmp_path):
    path = tmp_path / "pairs.toml"
    path.write_text(
        '[base]\ncell = "lstm"\n"cell_options.peephole" = "full"\n'
        '[axes]\nmodel = [{ hidden_size = 8, cell_options = { peephole = "diagonal" } }, { hidden_size = 9 }]\n',
        encoding="utf-8",
    )
    assert [point.settings for point in load_plan(path).points()] == [
        {"cell": "lstm", "hidden_size": 8, "cell_options": {"peephole": "diagonal"}},
        {"cell": "lstm", "hidden_size": 9, "cell_options": {"peephole": "full"}},
    ]


@pytest.mark.parametrize(
    "profile, expected",
    [
        ("base", "profiles.small.base.layers must be an integer, not 2.5"),
        ("axes", "profiles.small.axes.layers[1] must be an integer, not 2.5"),
    ],
)
def test_a_profile_not_chosen_is_checked_too(tmp_path, profile, expected):
    """A plan is checked whole: a bad value in a profile is found whichever profile (or none) runs."""
    from charlm.errors import CharlmError
    from charlm.experiments.plan import load_plan

    value = "layers = 2.5" if profile == "base" else "layers = [1, 2.5]"
    plan = tmp_path / "profiles.toml"
    plan.write_text(
        f'[base]\ncorpus = "pydoc"\n[axes]\ncell = ["gru"]\n[profiles.small.{profile}]\n{value}\n'
        "[profiles.tiny.base]\nhidden_size = 8\n",
        encoding="utf-8",
    )
    for chosen in (None, "tiny"):
        with pytest.raises(CharlmError, match=re.escape(f"plan {plan}: {expected}")):
            load_plan(plan, chosen)

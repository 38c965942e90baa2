"""`charlm demo` runs the whole pipeline end to end on the embedded corpus (here on a short budget),
after sizing its model to the throughput it measures; the sizing rule is checked on given figures."""

import pytest
import torch

from charlm.cli.output import best_epoch_text, epochs_text
from charlm.tools.demo import Sizing, about, choose_size, describe, faster_threads
from helpers import cli

SIZES = {192: 400_000, 128: 600_000, 64: 1_500_000}


def test_demo_prepares_sizes_trains_evaluates_and_samples(tmp_path):
    threads = torch.get_num_threads()
    result = cli(
        "demo", "--minutes", "0.02", "--data-dir", tmp_path / "data", "--run-dir", tmp_path / "run", check_code=0
    )
    assert "sample (400 characters after the prime" in result.stdout
    assert "\nThe " in result.stdout
    assert "test bpc" in result.stdout and "best valid bpc" in result.stdout
    assert "epochs          0 complete; stopped inside epoch 1 when the time budget ran out" in result.stdout
    assert "best epoch      1 (the partial epoch, evaluated where it stopped)" in result.stdout
    assert "sizing: hidden " in result.stderr and " chars/s measured: " in result.stderr
    assert "readable text needs about" in result.stderr and "try --minutes " in result.stderr  # 1 s cannot do
    assert (tmp_path / "data" / "pydoc" / "meta.json").is_file()
    assert (tmp_path / "run" / "best.pt").is_file()
    assert torch.get_num_threads() == threads


def test_the_largest_size_that_reaches_readable_text_is_chosen():
    fast = choose_size({192: 20_000}, SIZES, seconds_left=110)
    assert (fast.hidden_size, fast.chars_in_budget, fast.enough) == (192, 2_200_000, True)
    slower = choose_size({192: 3_000, 128: 6_000}, SIZES, seconds_left=110)  # 192 needs 133 s, 128 needs 100 s
    assert (slower.hidden_size, slower.enough) == (128, True)
    assert choose_size({192: 3_000, 128: 6_000, 64: 20_000}, SIZES, seconds_left=110).hidden_size == 128


def test_when_no_size_gets_there_the_soonest_one_is_trained_and_the_minutes_it_needs_are_said():
    sizing = choose_size({192: 500, 128: 900, 64: 2_000}, SIZES, seconds_left=100, seconds_spent=20)
    assert (sizing.hidden_size, sizing.enough) == (128, False)  # 667 s against 800 s (192) and 750 s (64)
    assert sizing.minutes_needed == 12  # (20 + 667) s
    assert choose_size({192: 1_000, 128: 1_500}, SIZES, seconds_left=10).hidden_size == 192  # a tie: the larger


def test_the_sizing_lines():
    enough = Sizing(
        hidden_size=192, threads=2, chars_per_second=17_477, seconds_left=118.6, seconds_spent=1.4, chars_needed=400_000
    )
    assert describe(enough) == [
        "sizing: hidden 192 on 2 threads, ~17,000 chars/s measured: ~2,100,000 characters in the "
        "1.98 min left (readable text needs ~400,000)"
    ]
    short = Sizing(
        hidden_size=128, threads=1, chars_per_second=1_062, seconds_left=115, seconds_spent=5, chars_needed=600_000
    )
    assert describe(short) == [
        "sizing: hidden 128 on 1 thread, ~1,100 chars/s measured: ~120,000 characters in the 1.92 min left "
        "(readable text needs ~600,000)",
        "this machine trains about 1,100 chars/s now; readable text needs about 600,000 characters: try --minutes 10",
    ]
    used_up = Sizing(
        hidden_size=192, threads=1, chars_per_second=14_000, seconds_left=-0.5, seconds_spent=1.7, chars_needed=400_000
    )
    assert "measured: the measurement took the whole budget (readable" in describe(used_up)[0]
    assert describe(used_up)[1].endswith("try --minutes 1")


def test_the_faster_thread_count_is_kept():
    assert faster_threads({1: 14_000, 2: 1_100}) == 1  # a busy machine: two threads wait on each other
    assert faster_threads({1: 14_000, 2: 24_000}) == 2
    assert faster_threads({1: 14_000, 2: 14_000}) == 2


@pytest.mark.parametrize(
    "number, text",
    [(17_477, "17,000"), (1_062, "1,100"), (999.6, "1,000"), (2_073_600, "2,100,000"), (42, "42"), (0, "0")],
)
def test_figures_are_rounded_to_two_significant_figures(number, text):
    assert about(number) == text


def test_the_summary_says_when_the_time_budget_ran_out_inside_an_epoch():
    complete = {"epochs": 4, "best_epoch": 4, "partial_epoch": False}
    assert (epochs_text(complete), best_epoch_text(complete)) == ("4", "4")
    stopped = {"epochs": 4, "best_epoch": 5, "partial_epoch": True}
    assert epochs_text(stopped) == "4 complete; stopped inside epoch 5 when the time budget ran out"
    assert best_epoch_text(stopped) == "5 (the partial epoch, evaluated where it stopped)"
    assert best_epoch_text({"epochs": 4, "best_epoch": 3, "partial_epoch": True}) == "3"


def test_the_summary_says_when_early_stopping_ended_training():
    early = {"epochs": 9, "best_epoch": 7, "partial_epoch": False, "stopped_by": "patience"}
    assert epochs_text(early) == "9; stopped early: no better validation bpc for 2 epochs"


def test_the_demo_stops_when_validation_stops_improving():
    from charlm.config_tools import DemoConfig
    from charlm.tools.demo import demo_config

    config = demo_config(DemoConfig(), 128, 2.0)
    assert config.patience == 2 and config.epochs > 10  # the time budget or two epochs without progress end it


def test_the_sizing_measurement_estimates_memory_before_it_builds_a_model(tiny_corpus, monkeypatch):
    """Each candidate size goes through the trainer's estimate first: where no memory is free, one
    line naming the figures, before any model is allocated."""
    import charlm.runtime.memory as memory
    from charlm.corpora import load_corpus
    from charlm.errors import CharlmError
    from charlm.tools.demo import demo_config, measure_throughput
    from charlm.config_tools import DemoConfig

    monkeypatch.setattr(memory, "available_memory", lambda device: 1024)
    config = demo_config(DemoConfig(), 64, 1.0, data_dir=tiny_corpus)
    built = []
    monkeypatch.setattr("charlm.tools.demo.LanguageModel", lambda *args: built.append(args))
    with pytest.raises(
        CharlmError, match=r"parameters needs about .* to train .* but cpu has .* free: use a smaller --hidden"
    ):
        measure_throughput(config, load_corpus("tiny", tiny_corpus), torch.device("cpu"), steps=1)
    assert built == []

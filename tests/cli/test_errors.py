"""Bad input: one line on stderr, exit code 2, no traceback, nothing written — case by case.

The cases here are also the table of docs/errors.md (every case) and of the README's Errors section
(the dozen named in README_CASES): `test_errors_tables_are_current` renders them and compares. After
adding or changing a case, rewrite both tables with

    CHARLM_WRITE_DOCS=1 python -m pytest tests/cli/test_errors.py -k tables
"""

from __future__ import annotations

import io
import os
import pickle
import random
import re
import shlex
import shutil
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import REPO, assert_one_line_error, cli, prepare_tiny_corpus


@dataclass(frozen=True)
class Case:
    """``command`` as the tables show it: DATA (a prepared `tiny` corpus), RUN (a trained run),
    FILES (the bad files below) stand for paths."""

    what: str
    command: str
    cpu_only: bool = False  # the message differs on a machine with a GPU


CASES = [
    # --- what to train ---
    Case("unknown corpus", "train --corpus nope"),
    Case("built-in corpus not prepared", "train --corpus wp"),
    Case("unknown cell", "train --cell nope"),
    Case("cell name misspelt", "train --cell mingr"),
    Case("corpus name misspelt", "train --corpus shakspeare"),
    Case("cell that is only a colon", "train --cell :"),
    Case("cell of a relative module", "train --cell .x:Y"),
    Case("unknown option", "train --nope"),
    Case("option without its value", "train --hidden"),
    Case("zero hidden size", "train --hidden 0"),
    Case("zero layers", "train --layers 0"),
    Case("negative embedding size", "train --embed-size -5"),
    Case("zero batch", "train --batch-size 0"),
    Case("zero BPTT length", "train --bptt 0"),
    Case("zero epochs", "train --epochs 0"),
    Case("zero learning rate", "train --lr 0"),
    Case("learning rate not a number", "train --lr fast"),
    Case("infinite learning rate", "train --lr inf"),
    Case("learning rate beyond its bound", "train --optimizer sgd --lr 1e38"),
    Case("zero learning-rate decay", "train --lr-decay 0"),
    Case("more evaluation streams than the split has symbols", "train --eval-batch-size 100000"),
    Case("more training streams than the training tokens used", "train --train-fraction 0.01 --batch-size 1000"),
    Case("a cell option that is not a number", "train --cell rhn --cell-opt gate_bias=nan"),
    Case("unknown optimizer", "train --optimizer lion"),
    Case("momentum with Adam", "train --momentum 0.9"),
    Case("zero accumulation", "train --accumulate 0"),
    Case("negative checkpoints to keep", "train --keep-checkpoints -1"),
    Case("dropout of 1", "train --dropout 1"),
    Case("weight drop on a cell without recurrent matrices", "train --cell transformer --weight-drop 0.5"),
    Case("locked and per-step dropout between layers", "train --dropout 0.2 --dropout-hidden 0.2"),
    Case("train fraction 0", "train --train-fraction 0"),
    Case("train fraction above 1", "train --train-fraction 1.5"),
    Case("negative clipping", "train --clip -1"),
    Case("zero patience", "train --patience 0"),
    Case("log every 0 steps", "train --log-every 0"),
    Case("negative eval interval", "train --eval-every -1"),
    Case("save interval not steps or minutes", "train --save-every soon"),
    Case("zero time budget", "train --max-minutes 0"),
    Case("budget not a number", "train --params abc"),
    Case("zero budget", "train --params 0"),
    Case("infinite budget", "train --params inf"),
    Case("budget no machine holds", "train --params 1e20"),
    Case("model no machine holds", "train --hidden 1000000"),
    Case("hidden size and budget", "train --hidden 8 --params 1M"),
    Case("unknown cell option", "train --cell lstm --cell-opt nope=1"),
    Case("cell option of the wrong type", "train --cell gru --cell-opt reset_after=maybe"),
    Case("unknown peephole form", "train --cell lstm --cell-opt peephole=maybe"),
    Case("cell option not key=value", "train --cell-opt peephole"),
    Case("unknown device", "train --device tpu"),
    Case("CUDA without a GPU", "train --device cuda", cpu_only=True),
    Case("unknown precision", "train --precision fp8"),
    Case("fp16 on the CPU", "train --device cpu --precision fp16"),
    Case("CUDA graphs on the CPU", "train --device cpu --cuda-graph"),
    Case("CUDA graphs and compilation at once", "train --cuda-graph --compile"),
    Case("MPS off a Mac", "train --device mps", cpu_only=True),
    Case("seed beyond 64 bits", "train --seed 18446744073709551616"),
    Case("hidden size by the trillion", "train --hidden 18446744073709551616"),
    Case("layers by the billion", "train --layers 2147483648"),
    Case("data directory that is a file", "train --data-dir FILES/latin-1.txt"),
    Case("threads beyond 64 bits", "--threads 18446744073709551616 cells"),
    # --- config files, resuming, run directories ---
    Case("missing config file", "train --config FILES/absent.json"),
    Case("config file not JSON", "train --config FILES/broken.json"),
    Case("config file with an unknown key", "train --config FILES/unknown-key.json"),
    Case("config file with a wrong type", "train --config FILES/wrong-type.json"),
    Case("config file that is a directory", "train --config FILES/empty-dir"),
    Case("config file naming a module", "train --config FILES/module-cell.json"),
    Case("config file with an integer too large for a number", "train --config FILES/huge-number.json"),
    Case("config file with a NUL in a path", "train --config FILES/nul-path.json"),
    Case("run directory already used", "train --run-dir RUN"),
    Case("run directory below a file", "train --run-dir FILES/latin-1.txt/run"),
    Case("resume a missing directory", "train --resume FILES/absent"),
    Case("resume a directory that is no run", "train --resume FILES/empty-dir"),
    Case("resume changing the model", "train --resume RUN --hidden 9"),
    Case("initial weights of another model", "train --hidden 9 --init-from RUN"),
    # --- checkpoints ---
    Case("missing checkpoint", "sample FILES/absent.pt"),
    Case("directory without checkpoints", "sample FILES/empty-dir"),
    Case("run interrupted before its first checkpoint", "sample FILES/interrupted-run"),
    Case("empty .pt file", "sample FILES/empty.pt"),
    Case("random bytes", "sample FILES/random.pt"),
    Case("truncated checkpoint", "sample FILES/truncated.pt"),
    Case("checkpoint cut to its first bytes", "sample FILES/stub.pt"),
    Case("a .pt file of something else", "sample FILES/other.pt"),
    Case("a pickle that would run code", "sample FILES/code.pt"),
    Case("best.pt a link to a text file", "sample FILES/linked-run"),
    Case("a corpus with another vocabulary", "eval RUN --data-dir FILES/other-data"),
    Case("a corpus of other text, under the run's corpus name", "eval RUN --data-dir FILES/other-text-data"),
    Case("the checkpoint's corpus absent", "eval RUN --data-dir FILES/empty-dir"),
    Case("checkpoint vocabulary shorter than its output layer", "sample FILES/short-vocab.pt"),
    Case("checkpoint vocabulary with a multi-character symbol", "sample FILES/long-symbol.pt"),
    Case("checkpoint vocabulary stored as a tensor", "sample FILES/tensor-vocab.pt"),
    Case("checkpoint with a vocabulary size of 10^9", "eval FILES/huge-vocab.pt"),
    Case("checkpoint with a hidden size of 2.5", "sample FILES/fractional-hidden.pt"),
    Case("checkpoint weight of the wrong shape", "export FILES/wrong-shape.pt FILES/out.pt"),
    Case("resume from an optimizer state of the wrong shape", "train --resume FILES/wrong-optimizer-run"),
    Case("resume a last.pt of another cell", "train --resume FILES/other-cell-run"),
    # --- sampling ---
    Case("negative temperature", "sample RUN --temperature -1"),
    Case("negative top-k", "sample RUN --top-k -1"),
    Case("top-p 0", "sample RUN --top-p 0"),
    Case("top-p above 1", "sample RUN --top-p 1.5"),
    Case("negative length", "sample RUN --length -1"),
    Case("length no machine holds", "sample RUN --length 10000000000000"),
    Case("empty prime", "sample RUN --prime ''"),
    Case("prime outside the vocabulary", "sample RUN --prime 中文"),
    Case("prime file not UTF-8", "sample RUN --prime-file FILES/latin-1.txt"),
    Case("prime and prime file", "sample RUN --prime a --prime-file FILES/latin-1.txt"),
    Case("beam search with a temperature", "sample RUN --beam 4 --temperature 0.8"),
    Case("beam search with several samples", "sample RUN --beam 4 --num-samples 2"),
    Case("beam search no machine holds", "sample RUN --beam 9223372036854775807", cpu_only=True),
    Case("length penalty without a beam", "sample RUN --length-penalty 0.7"),
    Case("empty stop string", "sample RUN --stop ''"),
    Case("infinite temperature", "sample RUN --temperature inf"),
    # --- evaluation and scoring ---
    Case("evaluate the training split", "eval RUN --split train"),
    Case("zero evaluation batch", "eval RUN --batch-size 0"),
    Case("zero evaluation window", "eval RUN --bptt 0"),
    Case("more evaluation streams than the split has symbols", "eval RUN --batch-size 100000"),
    Case("more dynamic-evaluation streams than the split", "eval RUN --dynamic sgd --batch-size 100000"),
    Case(
        "search prefix with fewer symbols than streams",
        "eval RUN --dynamic sgd --dyn-search --search-prefix 10 --batch-size 16",
    ),
    Case("more scoring streams than the text has symbols", "score RUN FILES/short.txt --batch-size 100"),
    Case("unknown dynamic method", "eval RUN --dynamic adam"),
    Case("dynamic method left out", "eval RUN --dynamic --dyn-lr 0.1"),
    Case("zero search prefix", "eval RUN --dynamic sgd --dyn-search --search-prefix 0"),
    Case("missing text to score", "score RUN FILES/absent.txt"),
    Case("text to score not UTF-8", "score RUN FILES/latin-1.txt"),
    Case("text outside the vocabulary", "score RUN FILES/chinese.txt"),
    # --- corpora ---
    Case("prepare an unknown corpus", "prepare nope"),
    Case("prepare a misspelt corpus", "prepare shakspeare"),
    Case("prepare text without a name", "prepare text FILES/chinese.txt"),
    Case("prepare a missing file", "prepare text FILES/absent.txt --name mine"),
    Case("prepare text that is not UTF-8", "prepare text FILES/latin-1.txt --name mine"),
    Case("split fraction not a number", "prepare text FILES/short.txt --name mine --split nan,0.5,0.5"),
    Case("prepare text under a built-in corpus's name", "prepare text FILES/short.txt --name pydoc"),
    Case("download from a non-address", "prepare wp --url 'not a url'"),
    Case("download from a local file URL", "prepare wp --url file:///etc/passwd"),
    Case("local copy that is a loop of links", "prepare ptb --source FILES/loop"),
    Case("prepare a link to nowhere", "prepare text FILES/dangling --name mine"),
    Case("prepare into a data directory that is a file", "prepare pydoc --data-dir FILES/latin-1.txt"),
    Case("corpus array truncated", "train --data-dir FILES/truncated-data"),
    Case("corpus meta.json that is a list", "train --data-dir FILES/list-meta-data"),
    Case("corpus array unlike its checksum", "eval RUN --data-dir FILES/zeroed-data"),
    Case("corrupt .tar.xz", "prepare ptb --source FILES/truncated.tar.xz"),
    Case("zip with an encrypted member", "prepare ptb --source FILES/encrypted.zip"),
    # --- other commands ---
    Case("export into a missing directory", "export RUN FILES/absent/model.pt"),
    Case("export over an existing file", "export RUN FILES/latin-1.txt"),
    Case("export to an unknown format", "export RUN FILES/step.bin --format tflite"),
    Case("list runs of a missing directory", "runs FILES/absent"),
    Case("prune options without --prune", "runs RUN --dry-run"),
    Case("plan named outside its sweep directory", "sweep FILES/climbing-plan.toml"),
    Case("plan profile whose base is a number", "sweep FILES/profile-base-number.toml"),
    Case("plan with a bad value in its last point", "sweep FILES/late-bad-value.toml --data-dir DATA"),
    Case("sweep estimate option without --dry-run", "sweep lru-table1 --no-estimate"),
    Case("plan setting misspelled", "sweep FILES/misspelled-plan.toml"),
    Case("plan evaluation wider than the split", "sweep FILES/wide-eval-plan.toml --data-dir DATA --dir FILES/sweep"),
    Case(
        "plan naming a device this machine lacks",
        "sweep FILES/absent-device-plan.toml --data-dir DATA --dir FILES/sweep",
        cpu_only=True,
    ),
    Case("torchrun timeout of zero", "train --dist-timeout 0"),
    Case("benchmark zero steps", "bench --steps 0"),
    Case("benchmark an unknown cell", "bench --cells nope"),
    Case("benchmark a budget no machine holds", "bench --params 1e23"),
    Case("task network no machine holds", "task parity --hidden 1000000"),
    Case("task batch no machine holds", "task parity --batch-size 100000000"),
    Case("demo with no time", "demo --minutes 0"),
    Case("benchmark no cell", "bench --cells ''"),
    Case("check no precision", "check --cells rnn --precision ''"),
    Case("check budget without --full", "check --cells rnn --budget 3"),
    Case("an empty path", "report RUN --out ''"),
    Case("report into a file", "report RUN --out FILES/latin-1.txt"),
]

BAD_PLAN_FILES = {  # the plans of the sweep cases (the full table: tests/experiments/test_plan_reader.py)
    "profile-base-number.toml": '[axes]\ncell = ["gru"]\n[profiles.small]\nbase = 3\n',
    "late-bad-value.toml": '[base]\ncorpus = "tiny"\n[axes]\nlayers = [1, 2, 2.5]\n',
    "misspelled-plan.toml": '[base]\nbatchsize = 32\n[axes]\ncell = ["gru"]\n',
    "wide-eval-plan.toml": '[base]\ncorpus = "tiny"\n[axes]\ncell = ["gru"]\n[[eval]]\nbatch_size = 100000\n',
    "absent-device-plan.toml": '[base]\ncorpus = "tiny"\nhidden_size = 8\n[axes]\ndevice = ["cpu", "cuda:99"]\n',
}

BASE_ARGS = {  # put before the case's own arguments, which win; not shown in the tables
    "train": ["--corpus", "tiny", "--data-dir", "DATA", "--run-dir", "FILES/new-run"],
    "eval": ["--data-dir", "DATA"],
    "score": [],
    "prepare": ["--data-dir", "FILES/data"],
    "demo": ["--data-dir", "FILES/data", "--run-dir", "FILES/new-run"],
    "task": ["--run-dir", "FILES/new-task-run"],
}


@pytest.fixture(scope="module")
def places(trained_run, tiny_corpus, tmp_path_factory) -> dict[str, Path]:
    files = tmp_path_factory.mktemp("bad-files")
    best = (trained_run / "best.pt").read_bytes()
    (files / "empty.pt").write_bytes(b"")
    (files / "random.pt").write_bytes(bytes(range(256)) * 4)
    (files / "truncated.pt").write_bytes(best[: len(best) // 3])
    (files / "stub.pt").write_bytes(best[:10])  # shorter than a zip archive's directory: miniz's "not a ZIP archive"
    torch.save({"weights": torch.zeros(3)}, files / "other.pt")
    (files / "code.pt").write_bytes(pickle.dumps(_WritesAMarker(str(files / "MARKER"))))
    (files / "broken.json").write_text('{"cell": "lstm",', encoding="utf-8")
    (files / "unknown-key.json").write_text('{"hiden": 64}', encoding="utf-8")
    (files / "wrong-type.json").write_text('{"epochs": "many"}', encoding="utf-8")
    (files / "module-cell.json").write_text('{"cell": "evilmod:Nope"}', encoding="utf-8")
    (files / "huge-number.json").write_text('{"lr": 1' + "0" * 400 + "}", encoding="utf-8")
    (files / "nul-path.json").write_text('{"init_from": "runs/a\\u0000b"}', encoding="utf-8")
    (files / "latin-1.txt").write_bytes("café".encode("latin-1"))
    (files / "chinese.txt").write_text("中文", encoding="utf-8")
    (files / "short.txt").write_text("the cat", encoding="utf-8")
    (files / "empty-dir").mkdir()
    (files / "loop").symlink_to("loop")  # a link to itself
    (files / "dangling").symlink_to(files / "absent.txt")
    (files / "linked-run").mkdir()
    (files / "linked-run" / "best.pt").symlink_to(files / "short.txt")  # a run whose best.pt is a link to text
    (files / "interrupted-run").mkdir()  # a run killed before its first save: its settings and its start record
    shutil.copy(trained_run / "config.json", files / "interrupted-run")
    start = (trained_run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()[0]
    (files / "interrupted-run" / "metrics.jsonl").write_text(start + "\n", encoding="utf-8")
    (files / "climbing-plan.toml").write_text('name = "../elsewhere"\n[axes]\ncell = ["lru"]\n', encoding="utf-8")
    for name, text in BAD_PLAN_FILES.items():
        (files / name).write_text(text, encoding="utf-8")
    prepare_tiny_corpus(files / "other-data", characters=3000)  # `tiny` again, with fewer symbols
    prepare_tiny_corpus(files / "other-text-data", characters=39_000)  # `tiny` again, its vocabulary, other text
    _damaged_corpora_and_archives(files, tiny_corpus)
    _damaged_checkpoints(files, trained_run)
    return {"DATA": tiny_corpus, "RUN": trained_run, "FILES": files}


def _damaged_checkpoints(files: Path, trained_run: Path) -> None:
    """Tampered copies of the run's best.pt, and copies of the run whose last.pt is tampered with
    (the full table is tests/test_checkpoint_reader.py)."""
    import shutil

    def tampered(source: Path, target: Path, change) -> None:
        payload = torch.load(source, weights_only=True)
        change(payload)
        torch.save(payload, target)

    def shorter(payload):
        del payload["tokenizer"]["vocab"][1]
        payload["model_config"]["vocab_size"] -= 1

    def other_cell(payload):
        from charlm.model import LanguageModel, ModelConfig

        config = ModelConfig(**{**payload["model_config"], "cell": "gru"})
        payload["model_config"], payload["weights"] = config.to_dict(), LanguageModel(config).state_dict()

    best = trained_run / "best.pt"
    tampered(best, files / "short-vocab.pt", shorter)
    tampered(best, files / "long-symbol.pt", lambda payload: payload["tokenizer"]["vocab"].__setitem__(1, "ab"))
    tampered(
        best, files / "tensor-vocab.pt", lambda payload: payload["tokenizer"].__setitem__("vocab", torch.arange(5))
    )
    tampered(best, files / "huge-vocab.pt", lambda payload: payload["model_config"].__setitem__("vocab_size", 10**9))
    tampered(
        best, files / "fractional-hidden.pt", lambda payload: payload["model_config"].__setitem__("hidden_size", 2.5)
    )
    tampered(
        best,
        files / "wrong-shape.pt",
        lambda payload: payload["weights"].__setitem__("layers.0.gate_weight", torch.zeros(3, 5)),
    )
    for name, change in (
        (
            "wrong-optimizer-run",
            lambda payload: payload["training"]["optimizer"]["state"][0].__setitem__("exp_avg", torch.zeros(7, 3)),
        ),
        ("other-cell-run", other_cell),
    ):
        shutil.copytree(trained_run, files / name)
        tampered(files / name / "last.pt", files / name / "last.pt", change)


def _damaged_corpora_and_archives(files: Path, tiny_corpus: Path) -> None:
    """Copies of `tiny` damaged (an array truncated, one zeroed, meta.json a list), a .tar.xz cut in
    half, a zip whose member is marked encrypted."""
    for name in ("truncated-data", "zeroed-data", "list-meta-data"):
        shutil.copytree(tiny_corpus, files / name)
    train = files / "truncated-data/tiny/train.npy"
    train.write_bytes(train.read_bytes()[:-100])
    test = files / "zeroed-data/tiny/test.npy"
    np.save(test, np.zeros_like(np.load(test)))
    (files / "list-meta-data/tiny/meta.json").write_text("[]", encoding="utf-8")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as archive:
        info = tarfile.TarInfo("ptb.char.train.txt")
        info.size = 100_000
        archive.addfile(info, io.BytesIO(random.Random(0).randbytes(info.size)))
    (files / "truncated.tar.xz").write_bytes(buffer.getvalue()[:50_000])
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("ptb.char.train.txt", "a b _ c \n")
    raw = bytearray(buffer.getvalue())
    raw[6] |= 1  # the member's flags, in its local header and the central directory: encrypted
    raw[raw.index(b"PK\x01\x02") + 8] |= 1
    (files / "encrypted.zip").write_bytes(bytes(raw))


class _WritesAMarker:
    """Unpickled, this would create a file: it never is (loads are weights-only)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def arguments(case: Case, places: dict[str, Path]) -> list[str]:
    words = shlex.split(case.command)
    if "--resume" not in words:
        words[1:1] = BASE_ARGS.get(words[0], [])
    return [_fill(word, places) for word in words]


def _fill(word: str, places: dict[str, Path]) -> str:
    for name, path in places.items():
        word = re.sub(rf"\b{name}\b", str(path), word)
    return word


def shown_message(stderr: str, places: dict[str, Path]) -> str:
    """The error line with paths put back as DATA, RUN, FILES and machine-specific figures as …"""
    line = stderr.strip().splitlines()[-1].removeprefix("charlm: error: ")
    for name, path in sorted(places.items(), key=lambda item: -len(str(item[1]))):
        line = line.replace(str(path), name)
    line = re.sub(r"has [\d.,]+ [GM]iB free", "has … free", line)
    return line


def run_case(case: Case, places: dict[str, Path]):
    if case.cpu_only and (torch.cuda.is_available() or torch.backends.mps.is_available()):
        pytest.skip("the message differs on a machine with this device")
    return cli(*arguments(case, places))


@pytest.mark.parametrize("case", CASES, ids=[case.what for case in CASES])
def test_bad_input_is_one_line_and_writes_nothing(case, places):
    before = _snapshot(places)
    result = run_case(case, places)
    assert_one_line_error(result)
    assert result.stdout == ""
    assert _snapshot(places) == before
    assert not (places["FILES"] / "MARKER").exists()


def _snapshot(places) -> dict[str, int]:
    """Every file under the places, with its size."""
    return {
        str(path): path.stat().st_size for root in places.values() for path in sorted(root.rglob("*")) if path.is_file()
    }


def test_there_are_at_least_forty_distinct_cases():
    assert len({case.command for case in CASES}) == len(CASES) >= 40


def test_top_k_above_the_vocabulary_samples_from_all_with_a_warning(places):
    result = cli("sample", places["RUN"], "--top-k", "5000", "--length", "20", "--seed", "3", check_code=0)
    assert "warning: top-k 5000 is more than the" in result.stderr
    unfiltered = cli("sample", places["RUN"], "--top-k", "0", "--length", "20", "--seed", "3", check_code=0)
    assert result.stdout == unfiltered.stdout


README_CASES = [  # the dozen rows the README shows, by their `what`; docs/errors.md shows every case
    "unknown corpus",
    "built-in corpus not prepared",
    "unknown cell",
    "zero hidden size",
    "learning rate not a number",
    "unknown cell option",
    "CUDA without a GPU",
    "a pickle that would run code",
    "prime outside the vocabulary",
    "text outside the vocabulary",
    "corpus array unlike its checksum",
    "plan with a bad value in its last point",
]


def render_rows(places) -> list[tuple[Case, str]]:
    """Each case with its row of the table."""
    rows = []
    for case in CASES:
        result = cli(*arguments(case, places))
        message = shown_message(result.stderr, places)
        rows.append((case, f"| {case.what} | `charlm {case.command}` | {_cell(message)} |"))
    return rows


def render_table(rows: list[str]) -> str:
    return "\n".join(["| What | Command | Message |", "| --- | --- | --- |", *rows]) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")


TABLE_START = "<!-- errors table: generated from tests/cli/test_errors.py -->\n"
TABLE_END = "<!-- end of errors table -->"
ERRORS_PAGE = REPO / "docs" / "errors.md"  # every case
README = REPO / "README.md"  # the README_CASES


def test_readme_cases_are_a_dozen_cases():
    whats = [case.what for case in CASES]
    assert len(set(README_CASES)) == len(README_CASES) and 10 <= len(README_CASES) <= 14
    assert all(whats.count(what) == 1 for what in README_CASES), "each of README_CASES must name one case of CASES"


def test_errors_tables_are_current(places):
    if torch.cuda.is_available() or torch.backends.mps.is_available():
        pytest.skip("the tables show the messages of a machine without a GPU")
    rows = render_rows(places)
    tables = {
        ERRORS_PAGE: render_table([row for _, row in rows]),
        README: render_table([row for case, row in rows if case.what in README_CASES]),
    }
    stale = []
    for path, table in tables.items():
        text = path.read_text(encoding="utf-8")
        start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
        if os.environ.get("CHARLM_WRITE_DOCS") == "1":
            path.write_text(text[:start] + table + text[end:], encoding="utf-8")
        elif text[start:end] != table:
            stale.append(str(path.relative_to(REPO)))
    assert stale == [], f"errors table stale in {', '.join(stale)}: rerun with CHARLM_WRITE_DOCS=1"

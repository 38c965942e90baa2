"""Where prepared corpora live (``--data-dir``, else ``$CHARLM_DATA``, else ``./data``) and which are
there, without numpy or torch: shell completion of ``--corpus`` lists them."""

import os
from pathlib import Path

from charlm.files import check_directory, path_value

DEFAULT_DATA_ROOT = "data"
META = "meta.json"  # a prepared corpus is a directory of the data root that holds one


def data_root(data_dir: str | Path | None = None) -> Path:
    """Where prepared corpora live: ``data_dir``, else ``$CHARLM_DATA``, else ``./data``."""
    if data_dir is not None and not (isinstance(data_dir, str) and data_dir == ""):
        root = path_value(data_dir, "data_dir")  # from Python: checked as --data-dir is on the command line
        check_directory(root, "data_dir")
        return root
    from_environment = os.environ.get("CHARLM_DATA")
    check_directory(from_environment, "CHARLM_DATA")  # a file there is bad input, said as --data-dir's is
    return Path(from_environment or DEFAULT_DATA_ROOT)


def prepared_names(root: Path) -> list[str]:
    """The names of the corpora prepared in ``root``, sorted (a hidden directory is one being written)."""
    if not root.is_dir():
        return []
    return [path.name for path in sorted(root.iterdir()) if not path.name.startswith(".") and (path / META).exists()]

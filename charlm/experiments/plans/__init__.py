"""The sweep plans shipped with charlm (TOML files; `charlm sweep --list`)."""

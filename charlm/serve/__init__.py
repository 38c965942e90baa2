"""`charlm serve`: models behind an HTTP API and a web page (the optional extra charlm[serve])."""

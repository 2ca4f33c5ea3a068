"""The names a caller chooses among (supervision encodings, data paths), importable without torch
so that the CLI can list them in --help and refuse a wrong one before any heavy import."""

NEMO, LOGITS, HIDDEN = "nemo", "logits", "hidden"
ENCODINGS = (NEMO, LOGITS, HIDDEN)
AUTO = "auto"
ENCODING_CHOICES = (AUTO, *ENCODINGS)
DATA_PATHS = (AUTO, "wire", "p2p")

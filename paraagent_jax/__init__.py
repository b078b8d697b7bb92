"""ParaAgent-JAX: parallel acting in open-world tool environments, in JAX."""

__version__ = "0.1.0"

import os as _os

# transformers prints "PyTorch was not found. Models won't be available ..."
# on import when torch is absent; this project needs only its tokenizers and
# configs (and its own JAX models), so that advice is noise. Set
# TRANSFORMERS_NO_ADVISORY_WARNINGS= (empty) to see it.
_os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

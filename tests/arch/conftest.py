"""tests/arch imports the GGUF writers of tests/gguf (gguf_fixtures), wherever pytest starts."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gguf"))

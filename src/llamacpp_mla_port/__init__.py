"""llamacpp-mla-port: renders, applies and proves a patch series that teaches llama.cpp
to run the MLA-native Kimi-K3 DSpark draft model."""

from pathlib import Path

__version__ = "0.1.0"

#: The project checkout (holds templates/, patches/, Makefile). The tool runs from it.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
TEMPLATES_DIR = PROJECT_ROOT / "templates"
PATCHES_DIR = PROJECT_ROOT / "patches"

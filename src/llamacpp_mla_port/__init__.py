"""llamacpp-mla-port: renders, applies and proves a patch series that teaches llama.cpp
to run the MLA-native Kimi-K3 DSpark draft model.

The tool acts on the project checkout you stand in (see `project`), never on the folder
the package happens to be installed from.
"""

__version__ = "0.1.0"

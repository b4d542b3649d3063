"""quantrack: decide whether to quantize an LLM by measuring what each arm trades.

The library is usable without the CLI: import the module that owns a concern
(``quantrack.hardware.capacity``, ``quantrack.hardware.rulebook``, ``quantrack.engines`` ...).
"""

__version__ = "0.1.0"

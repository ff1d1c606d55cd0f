"""draftwheel: a continual-distillation flywheel for speculative-decoding draft models.

This package holds what every stage shares: the state directory (`home`), typed config loading
(`config`), the single MLflow module (`tracking`) and the command line (`cli`). It imports nothing
from serving/, mining/, training/ or flows/ at module level.
"""

__version__ = "0.1.0"

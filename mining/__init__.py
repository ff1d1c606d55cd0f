"""Mining: serving logs -> distillation, preference and hold-out datasets (see docs/mining.md)."""

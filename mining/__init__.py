"""mining package."""

"""nanoserve's built-in policies and observers, each module registered by its own entry point
in pyproject.toml, exactly as a third-party package would register its own."""

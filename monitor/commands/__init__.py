"""Command groups of the `lstar` CLI; each module exposes `register(app)`."""

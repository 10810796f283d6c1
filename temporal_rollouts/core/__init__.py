"""The bottom layer: shared models, errors, settings and search attributes; imports no other layer."""

"""Where sandbox containers run: one small base class and one module per backend."""

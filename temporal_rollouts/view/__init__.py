"""`rollouts view`: a local web page over batches and rollouts (see app.py)."""

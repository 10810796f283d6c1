"""The model-facing tool catalogue (what the model is told, how its calls become sandbox operations) and toolsets."""

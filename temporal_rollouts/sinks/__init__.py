"""Where scored groups go: built from rollout results, appended once to JSONL, posted to Atropos' run-api."""

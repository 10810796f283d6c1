"""Object storage for what must not live in workflow histories: large payloads (through
Temporal's ExternalStorage), transcripts stored once per message, and workspace snapshots."""

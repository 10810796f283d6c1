"""Unit tests: no processes; fakes only at the transport seam (httpx.MockTransport)."""

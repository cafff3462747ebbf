"""The Hugging Face Hub: one client setup with bounded requests and scrubbed errors, and checkpoint sync."""

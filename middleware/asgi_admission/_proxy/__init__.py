"""What a replica tells the proxy in front of it: its room for sessions (docs/containers.md)."""

"""What a replica tells the proxy in front of it: its capacity for sessions (docs/containers.md)."""

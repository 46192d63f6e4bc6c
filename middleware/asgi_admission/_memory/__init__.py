"""Reading memory: cgroup files, their parsing and discovery, and the opt-in host reader."""

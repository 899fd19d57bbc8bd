"""This host: its CPUs, how paths are shown and where transient arrays live, and big folders deleted off the critical path."""

"""Several gateway processes on one port (`kvgate gateway --workers N`): a parent that keeps N
workers alive, and the private channel over which the workers sum their state for operators."""

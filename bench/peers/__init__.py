"""Reference systems kvgate is measured against, run from their own virtual environments."""

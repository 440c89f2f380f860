"""The simulated engine (``kvgate engine --sim``): a cost-model runner that puts the real scheduler
and block manager behind simulated forward passes (``sim_runner``), and GPU-shaped cost presets
computed from the planner's arithmetic (``sim_presets``).
"""

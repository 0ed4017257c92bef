"""What rdmad shows the world beyond its own process: the local API and metrics.

Everything here sees the agent only through the status store (``rdmad.status``) and
the trigger queue (``rdmad.triggers``), never the agent object.
"""

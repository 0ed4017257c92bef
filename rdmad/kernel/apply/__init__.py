"""Observing and applying: ``KernelHost``, the one writer to the kernel.

``observe`` builds an ``Observed`` from sysfs and netlink; ``host`` is ``KernelHost``
(apply(); its reading half, observe(), is ``host_observe``); ``writes`` describes the
kernel writes an action stands for, ``recheck`` looks again right before a destructive
one, ``slowwrite`` runs sysfs writes that can block, ``results`` says what became of
each; ``dryrun`` records instead of writing; ``oneshot`` observes once for the command
line.

The top of the kernel layer: it may import every other room; nothing under
``rdmad.kernel`` imports it (contracts in pyproject.toml).
"""

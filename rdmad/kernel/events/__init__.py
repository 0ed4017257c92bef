"""Event sources: what tells the agent that the kernel changed.

udev events (``udev``), the kernel's own RDMA device uevents read off the socket
(``uevents``) with the filter that keeps other subsystems off it (``uevent_filter``),
link and address events (``linkevents``), and the rxe adds a reader sends itself the
moment an awaited event is read (``reflex``: armed and checked by the agent's passes).

May import: the netlink wire (``kernel.netlink``), ``kernel.sysfs``, the pause file.
Applies nothing: no import of ``kernel.apply`` (contract in pyproject.toml).
"""

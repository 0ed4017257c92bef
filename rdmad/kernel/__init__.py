"""The only code that touches the host: sysfs, procfs, rtnetlink, RDMA netlink, udev, modules.

Rooms: ``netlink`` (the wire), ``events`` (what says the kernel changed), ``usage`` (who
holds what), ``apply`` (``KernelHost``: observe and apply, the one writer). Beside them:
``sysfs``/``sysfs_files`` (every /sys and /proc path), ``errors``, ``modules``,
``peermem_probe`` and the files rdmad owns (``guardhook``, ``pause``). How the rooms may
import each other is an import-linter contract (pyproject.toml).
"""

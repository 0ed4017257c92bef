"""Who uses what: the holders of a VF or an RDMA device, and where a moved netdev went.

``holders``: open files under /proc (vfio groups and cdevs, uverbs), libvirt domains,
RDMA links on a netdev, a netdev gone from this namespace; unknown counts as in use.
``netns``: rtnetlink queries, without entering a namespace, that name where it went.
(The kernel users of an RDMA device come from its resource dump: ``kernel.netlink``.)

May import: ``kernel.sysfs``, ``kernel.errors``, the netlink framing, the model.
Not the apply room nor the event sources (contracts in pyproject.toml): the guard
(``rdmad.guard``) runs this same code inside `modprobe -r`.
"""

"""The netlink wire: rdmad's own rtnetlink and RDMA netlink ("nldev") clients.

The socket transport (``nlsock``), the framing (``nlcodec``), the codecs that turn
messages into typed values and back (``rtnl_codec``, ``rtnl_vf_attrs``, ``rdma_codec``),
the clients built on them (``rtnetlink.RtNetlink``, ``rdma.RdmaNetlink``), VF changes
sent with fallback and read back (``vf_apply``), and the users of an RDMA device as its
resource dump tells them (``rdma_usage``: kept beside the one client that decodes that
dump, so this room and ``kernel.usage`` do not import each other).

May import: ``kernel.sysfs`` and ``kernel.errors``, the model. Not the event sources,
the usage room or the apply room (contracts in pyproject.toml); the codecs and
``rdma_usage`` open no sockets.
"""

"""The only code that touches the host: sysfs, procfs, rtnetlink, RDMA netlink, udev, modules."""

"""pyroute2's netlink message classes, without the cost of pyroute2's package __init__.

rdmad uses pyroute2 for what it does well, building and parsing netlink messages
(``nlmsg``, ``nla``, ``ifinfmsg``). ``import pyroute2.netlink`` however first runs
``pyroute2/__init__.py``, which imports every family the library has (IPRoute,
NDB, IPSet, conntrack, devlink, ethtool, ...): 163 modules instead of 24, +11 MB
of RSS and ~0.1 s here, seconds under TCG. That is most of the daemon's start-up
on a small node, and rdmad needs none of it.

So the package is entered through a stand-in module that has the real package's
``__path__`` (submodules load from the installed library as usual) and runs the
real ``__init__`` only if some code asks the package itself for a name (e.g.
``from pyroute2 import IPRoute``): nothing breaks for a caller that wants all
of pyroute2, and rdmad does not pay for what it does not use.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any


def _enter_package() -> None:
    if "pyroute2" in sys.modules:
        return  # already imported (fully, or through this module)
    spec = importlib.util.find_spec("pyroute2")
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        raise ImportError("pyroute2 is not installed")
    package = types.ModuleType("pyroute2")
    package.__spec__ = spec
    package.__path__ = list(spec.submodule_search_locations)
    package.__file__ = spec.origin

    def load_everything(name: str) -> Any:
        # `from pyroute2 import config` inside pyroute2 asks for a submodule: give it that.
        try:
            return importlib.import_module(f"pyroute2.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"pyroute2.{name}":
                raise
        # Someone wants a name of the whole library: run its real __init__ into this module.
        del package.__getattr__
        assert spec.loader is not None
        spec.loader.exec_module(package)
        return getattr(package, name)

    package.__getattr__ = load_everything  # type: ignore[method-assign]
    sys.modules["pyroute2"] = package


_enter_package()

_netlink = importlib.import_module("pyroute2.netlink")
_ifinfmsg = importlib.import_module("pyroute2.netlink.rtnl.ifinfmsg")

nla = _netlink.nla
nlmsg = _netlink.nlmsg
ifinfmsg = _ifinfmsg.ifinfmsg

__all__ = ["ifinfmsg", "nla", "nlmsg"]

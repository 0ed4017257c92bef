"""The SR-IOV network operator's config daemon (sriov-network-config-daemon) on the host.

It keeps, per PF it configured, what it applied in ``/etc/sriov-operator/pci/<PCI
address>`` (written when it sets the PF up, removed when no policy selects the PF any
more); in its systemd mode (``sriov-config.service`` runs it at boot) the PFs it sets up
are listed by PCI address (``pciAddress:``) in
``/etc/sriov-operator/sriov-interface-config.yaml``. Either names the PF exactly.
"""

from __future__ import annotations

import re

from rdmad.managers.facts import Claim, Files, PfFacts

MANAGER = "sriov-network-operator"
BASE = "etc/sriov-operator"
PCI_DIR = f"{BASE}/pci"
SYSTEMD_CONFIG = f"{BASE}/sriov-interface-config.yaml"


class OperatorTrace:
    """What the config daemon left on the host: the PCI addresses of its stored PF
    states, and the text of its systemd mode's interface list (None: no such file)."""

    def __init__(self, files: Files) -> None:
        self.stored = frozenset(files.names(PCI_DIR))
        self.systemd_config = files.text(SYSTEMD_CONFIG)

    def claims(self, pf: PfFacts) -> list[Claim]:
        out = []
        if pf.pci in self.stored:
            out.append(
                Claim(MANAGER, f"/{PCI_DIR}/{pf.pci}", "the PF state its config daemon applied")
            )
        text = self.systemd_config
        if text is not None and re.search(
            rf"pciAddress:\s*[\"']?{re.escape(pf.pci)}[\"']?\s*$", text, re.MULTILINE
        ):
            out.append(
                Claim(
                    MANAGER,
                    f"/{SYSTEMD_CONFIG}",
                    f"pciAddress: {pf.pci} (sriov-config.service sets it up at boot)",
                )
            )
        return out

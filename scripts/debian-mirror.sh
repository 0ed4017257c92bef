#!/usr/bin/env bash
# Print the Debian mirror this machine's apt already uses for a suite (deb822 or
# one-line sources), so that nothing the project builds names a mirror itself.
#
#   bash scripts/debian-mirror.sh [SUITE]     (default bookworm)
#
# Exit 1, saying so, when no source lists the suite.
set -euo pipefail
suite=${1:-bookworm}
uri=$(awk -v s="$suite" '
    /^URIs:/ { u = $2 }
    /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == s) found = u }
    /^$/ { u = "" }
    END { print found }' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
if [[ -z $uri && -f /etc/apt/sources.list ]]; then
    uri=$(awk -v s="$suite" '$1 == "deb" && $3 == s { print $2; exit }' /etc/apt/sources.list)
fi
if [[ -z $uri ]]; then
    echo "debian-mirror: no '$suite' source in this machine's apt sources" >&2
    exit 1
fi
echo "$uri"

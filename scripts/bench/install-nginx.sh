#!/usr/bin/env bash
# Install nginx from the Debian packages if it is missing: the GET benchmark compares vwserver
# with a plain nginx proxy_pass in front of the same upstream. The benchmark starts its own nginx
# on a free port; the package's service must not start, so invoke-rc.d is told to skip it
# (policy-rc.d exit 101) unless a policy already exists.
set -euo pipefail

if command -v nginx >/dev/null 2>&1 || [[ -x /usr/sbin/nginx ]]; then
  exit 0
fi
sudo=()
if [[ $(id -u) -ne 0 ]]; then
  sudo=(sudo)
fi
policy=/usr/sbin/policy-rc.d
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
  "${sudo[@]}" chmod +x "$policy"
  trap '"${sudo[@]}" rm -f "$policy"' EXIT
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends nginx >&2

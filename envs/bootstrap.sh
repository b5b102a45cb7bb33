#!/usr/bin/env bash
# Install the Debian packages the netns cluster needs, only those that are missing (idempotent).
# Needs root; without it, says which packages to install and exits non-zero.
set -euo pipefail
need=()
command -v ip >/dev/null || need+=(iproute2)
command -v tc >/dev/null || need+=(iproute2)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh-keygen >/dev/null || need+=(openssh-client)
command -v iperf3 >/dev/null || need+=(iperf3)
command -v tcpdump >/dev/null || need+=(tcpdump)
command -v pkill >/dev/null || need+=(procps)
command -v python3 >/dev/null || need+=(python3)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "commscope: missing Debian packages: ${need[*]}; install them as root (apt-get install ${need[*]})" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}"

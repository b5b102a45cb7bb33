#!/usr/bin/env bash
# Install the Debian packages the netns cluster and the BPF wire accounting need, only those that
# are missing (idempotent).
# Needs root; without it, says which packages to install and exits non-zero.
set -euo pipefail
need=()
command -v ip >/dev/null || need+=(iproute2)
command -v tc >/dev/null || need+=(iproute2)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh-keygen >/dev/null || need+=(openssh-client)
command -v iperf3 >/dev/null || need+=(iperf3)
# The link model's accuracy tests measure RTT with ping -U.
command -v ping >/dev/null || need+=(iputils-ping)
command -v tcpdump >/dev/null || need+=(tcpdump)
command -v pkill >/dev/null || need+=(procps)
command -v python3 >/dev/null || need+=(python3)
# MTU frames on the experiment veths (TSO/GSO off) and the node's offload record.
command -v ethtool >/dev/null || need+=(ethtool)
# The in-kernel wire accounting: a tc BPF program compiled here (clang -target bpf, llvm-strip)
# against libbpf's helper headers.
command -v clang >/dev/null || need+=(clang)
command -v llvm-strip >/dev/null || need+=(llvm)
[ -e /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
# Delay and loss where the kernel has no netem: nftables for loss, iptables' NFQUEUE target and a
# C delayer built on the node against libnetfilter_queue (commscope.node.delayer).
command -v nft >/dev/null || need+=(nftables)
command -v iptables >/dev/null || need+=(iptables)
command -v cc >/dev/null || need+=(gcc libc6-dev)
# The capture's native kernel (commscope.workload.capture_native), built against torch and
# the interpreter's headers (Python.h: python3-dev for Debian's python3; a pyenv or
# python.org build brings its own).
command -v c++ >/dev/null || need+=(g++)
py="${PYTHON:-python3}"
inc="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null || true)"
[ -n "$inc" ] && [ -e "$inc/Python.h" ] || need+=(python3-dev)
[ -e /usr/include/libnetfilter_queue/libnetfilter_queue.h ] || need+=(libnetfilter-queue-dev)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
# The report is checked as a reader meets it: in headless Chromium (tests/integration/browser.py).
command -v chromium >/dev/null || need+=(chromium)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "commscope: missing Debian packages: ${need[*]}; install them as root (apt-get install ${need[*]})" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}"

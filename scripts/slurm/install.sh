#!/usr/bin/env bash
# Install Debian's SLURM and munge. Needs root.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq slurm-wlm munge >/dev/null

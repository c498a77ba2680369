#!/usr/bin/env bash
# Install Debian's SLURM, munge and (for sacct) slurmdbd + MariaDB. Needs root.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq slurm-wlm munge slurmdbd mariadb-server >/dev/null

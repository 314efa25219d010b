#!/bin/sh
# Prints a CLIProxyAPI config for `weir bench apart --peer`: one Claude API
# key per account (as many as --accounts), each pointed at the simulator.
# Usage: cliproxy-config.sh SIM_ADDR ACCOUNTS > /tmp/cliproxy.yaml
# docs/performance.md ("A peer beside weir") says why each line is there.
set -eu
sim=${1:?usage: cliproxy-config.sh SIM_ADDR ACCOUNTS}
n=${2:-8}
cat <<YAML
host: "127.0.0.1"
port: 8317
auth-dir: "/tmp/cliproxy-auth"
api-keys: ["sk-bench"]
usage-statistics-enabled: false
disable-claude-cloak-mode: true
remote-management: {secret-key: "", disable-control-panel: true}
claude-api-key:
YAML
i=0
while [ "$i" -lt "$n" ]; do
	cat <<YAML
  - api-key: "sk-ant-api03-bench-$i"
    base-url: "http://$sim"
    headers:
      X-Api-Key: "sk-ant-api03-bench-$i"
      Sim-Stream: "\$Sim-Stream"
YAML
	i=$((i + 1))
done

#!/usr/bin/env bash
# Install a Java 17+ runtime for TorchServe (its frontend is Java; 0.12 supports Java 17) from the
# distribution's packages, only when none is found. Usage: examples/torchserve/install_java.sh
set -euo pipefail

java_major() {  # the major version of `java` on PATH (or $JAVA_HOME/bin/java), 0 when there is none
    local java="${JAVA_HOME:+$JAVA_HOME/bin/}java"
    command -v "$java" >/dev/null 2>&1 || { echo 0; return; }
    "$java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\)[."].*/\1/p' | head -n1
}

have=$(java_major)
if [ "${have:-0}" -ge 17 ]; then
    echo "java ${have} found: nothing to install"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "install_java.sh: need root or sudo to install Java 17" >&2; exit 1; }
    SUDO="sudo"
fi

if command -v apt-get >/dev/null 2>&1; then          # Debian, Ubuntu
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends openjdk-17-jre-headless
elif command -v dnf >/dev/null 2>&1; then            # Fedora, RHEL 8+
    $SUDO dnf install -y java-17-openjdk-headless
elif command -v yum >/dev/null 2>&1; then            # older RHEL, Amazon Linux
    $SUDO yum install -y java-17-openjdk-headless
elif command -v zypper >/dev/null 2>&1; then         # openSUSE
    $SUDO zypper --non-interactive install java-17-openjdk-headless
elif command -v apk >/dev/null 2>&1; then            # Alpine
    $SUDO apk add --no-cache openjdk17-jre-headless
else
    echo "install_java.sh: no known package manager (apt-get, dnf, yum, zypper, apk); install Java 17 yourself" >&2
    exit 1
fi

have=$(java_major)
if [ "${have:-0}" -lt 17 ]; then
    echo "install_java.sh: installed, but 'java' on PATH is version ${have:-none}; put Java 17's bin first on PATH or set JAVA_HOME" >&2
    exit 1
fi
echo "java ${have} installed"

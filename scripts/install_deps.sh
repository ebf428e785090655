#!/bin/sh
# install_deps.sh — Debian packages the CPU build and tests need.
# clang + libclang-rt-dev are for `make fuzz`: libFuzzer's runtime
# (libclang_rt.fuzzer-x86_64.a) comes with libclang-rt-dev, which tracks the
# default clang (libclang-rt-14-dev for Debian 12's clang 14).
set -eu
need=""
for p in cmake make gcc pkg-config libpcre2-dev libcjson-dev python3 python3-pip clang libclang-rt-dev; do
    dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"
done
# A python with pip may come from elsewhere (pyenv); then python3-pip is not needed.
if command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1; then
    need=$(echo "$need" | sed 's/python3-pip//; s/ python3 / /')
fi
need=$(echo $need)
if [ -n "$need" ]; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $need
fi

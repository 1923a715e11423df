#!/bin/sh
# A CPU OpenCL device that compiles: on Debian/Ubuntu, the distribution's PoCL (pocl-opencl-icd),
# installed with apt-get where it is missing, as root or through sudo. The PoCL that pip brings
# with pyopencl (LLVM 14) cannot compile on CPUs newer than LLVM 14 knows. Elsewhere this says what
# to do and changes nothing (README, "Set-up").
set -e
[ -e /etc/OpenCL/vendors/pocl.icd ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-pocl: no apt-get here: install your system's PoCL or GPU OpenCL driver (README, 'Set-up')" >&2
    exit 0
fi
if [ "$(id -u)" = 0 ]; then
    as_root=
elif command -v sudo >/dev/null 2>&1; then
    as_root=sudo
else
    echo "install-pocl: not root and no sudo: ask for 'apt-get install pocl-opencl-icd' (README, 'Set-up')" >&2
    exit 0
fi
echo "install-pocl: ${as_root:+$as_root }apt-get install pocl-opencl-icd (a CPU OpenCL device that compiles)" >&2
$as_root apt-get update -qq
$as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends pocl-opencl-icd >/dev/null

#!/bin/sh
# Debian's chromium for the dashboard's browser test (Playwright drives it with executable_path; Playwright's
# own browser download cannot work without network access). Installs only when it is missing.
set -eu
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
$SUDO apt-get update
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y chromium

# Debian packages on this machine (the host, not a Debian root) that a script needs: it installs
# them itself, since a fresh machine runs only the README's two commands. Sourced, not run.

# host_packages_install PACKAGE...: installs those of PACKAGEs not installed yet (apt's lists are
# refreshed only when the install fails on stale ones).
host_packages_install() {
    local missing=() package
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    printf '\033[1m[packages]\033[0m installing %s (Debian packages)\n' "${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null ||
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; }
}

# Sourced by the scripts that fetch Debian packages with a private apt state
# (engine26.sh, buildkit-debian.sh).
#
# debian_mirror [OVERRIDE]: OVERRIDE when set, else the Debian archive the host
# already uses for bookworm (a local mirror or proxy keeps working), else
# Debian's CDN; without a trailing slash.
debian_mirror() {
  if [[ -n "${1:-}" ]]; then
    printf '%s\n' "${1%/}"
    return
  fi
  local uri rel comp
  while read -r uri rel comp; do
    if [[ ("$rel" == bookworm || "$rel" == stable) && "$comp" == main && "$uri" == http*://* ]]; then
      printf '%s\n' "${uri%/}"
      return
    fi
  done < <(apt-get indextargets --no-release-info \
    --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' 'Identifier: Packages' 2>/dev/null || true)
  printf '%s\n' "http://deb.debian.org/debian"
}

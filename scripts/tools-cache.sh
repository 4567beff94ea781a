# Sourced by scripts/control-plane.sh and scripts/real-vllm.sh: what they build or install lives in a cache outside
# the clone (${TESSERA_TOOLS_CACHE:-$HOME/.cache/tessera}), so a fresh clone reuses it, linked into the clone's .tools.

# link_into_clone NAME TARGET: $repo/.tools/NAME becomes a link to TARGET (replacing whatever was there).
link_into_clone() {
  mkdir -p "$repo/.tools"
  if [ "$(readlink "$repo/.tools/$1" 2>/dev/null)" != "$2" ]; then
    rm -rf "$repo/.tools/$1"
    ln -s "$2" "$repo/.tools/$1"
  fi
}

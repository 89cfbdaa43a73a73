#!/usr/bin/env bash
# action.yml, step `run`: the inputs (INPUT_*) as polyarch's flags; the markdown table to
# the job summary; outputs `record`, `digests` (JSON: image -> index digest), `covered`
# and `exit-code`. The step fails with polyarch's exit code.
set -euo pipefail
: "${POLYARCH:?the install step names the binary}"
command="${INPUT_COMMAND:-build}"
record="${INPUT_RECORD:-${RUNNER_TEMP:-/tmp}/polyarch-record.json}"

# words NAME: the input's words (spaces or lines), globs left to the caller.
words() { local -n into="$1"; read -r -d '' -a into <<<"${2:-}" || true; }
# lines INPUT FLAG: FLAG LINE for each non-empty line.
lines() {
  local line
  while IFS= read -r line; do
    line="${line#"${line%%[![:space:]]*}"}"
    line="${line%"${line##*[![:space:]]}"}"
    [[ -n "$line" ]] && args+=("$2" "$line")
  done <<<"${1:-}"
  return 0
}

args=("$command")
words images "${INPUT_IMAGES:-}"
case "$command" in
  build)
    args+=(-f "${INPUT_FILE:-polyarch.yaml}" "${images[@]}")
    [[ -n "${INPUT_PLATFORM:-}" ]] && args+=(--platform "$INPUT_PLATFORM")
    [[ "${INPUT_PUSH_BY_DIGEST:-false}" == true ]] && args+=(--push-by-digest)
    lines "${INPUT_SECRETS:-}" --secret
    lines "${INPUT_SET:-}" --set
    ;;
  verify)
    args+=(-f "${INPUT_FILE:-polyarch.yaml}" "${images[@]}")
    lines "${INPUT_SET:-}" --set
    ;;
  assemble)
    words parts "${INPUT_PARTS:-part-*.json}"
    # The globs expand here, in the workspace, as a shell step's would.
    # shellcheck disable=SC2206
    args+=(-f "${INPUT_FILE:-polyarch.yaml}" ${parts[@]})
    for image in "${images[@]}"; do args+=(--image "$image"); done
    lines "${INPUT_SET:-}" --set
    ;;
  gate)
    words manifests "${INPUT_MANIFESTS:-}"
    for m in "${manifests[@]}"; do args+=(--manifests "$m"); done
    args+=(--nodes "${INPUT_NODES:?the gate needs the nodes input}")
    ;;
  *)
    echo "::error::polyarch action: command '$command' is not build, verify, assemble or gate"
    exit 2
    ;;
esac
words insecure "${INPUT_INSECURE_REGISTRY:-}"
for host in "${insecure[@]}"; do args+=(--insecure-registry "$host"); done
words extra "${INPUT_ARGS:-}"
args+=("${extra[@]}" --record "$record" --output-format markdown)

table="$(mktemp)"
rc=0
if [[ -n "${INPUT_USERNAME:-}" ]]; then
  printf '%s' "${INPUT_PASSWORD:-}" |
    "$POLYARCH" "${args[@]}" --username "$INPUT_USERNAME" --password-stdin >"$table" || rc=$?
else
  "$POLYARCH" "${args[@]}" </dev/null >"$table" || rc=$?
fi
cat "$table"
if [[ "${INPUT_SUMMARY:-true}" == true && -n "${GITHUB_STEP_SUMMARY:-}" ]]; then
  cat "$table" >>"$GITHUB_STEP_SUMMARY"
fi

# Outputs from the record polyarch wrote (none when it stopped before one).
digests='{}'
covered=false
if [[ -s "$record" ]]; then
  case "$command" in
    gate) digests="$(jq -c '[.images[] | select(.digest) | {(.image): .digest}] | add // {}' "$record")" ;;
    *) digests="$(jq -c '[(.images // [])[] | select(.digest) | {(.name): .digest}] | add // {}' "$record")" ;;
  esac
  covered="$(jq -r 'if .covered == null then (.schema == "polyarch/part/v1") else .covered end' "$record")"
fi
{
  echo "record=$record"
  echo "digests=$digests"
  echo "covered=$covered"
  echo "exit-code=$rc"
} >>"$GITHUB_OUTPUT"
exit "$rc"

#!/usr/bin/env bash
# Post a gate report on its pull request as one comment, or update the comment an earlier run posted:
# the one whose first line is the same marker, written by AUTHOR. The Markdown comes from
# `cudagate report comment`, which escapes every name the pull request wrote; this script only moves it.
#
#   post.sh REPORT_DIR
#
# Environment: GH_TOKEN (pull-requests: write), REPO (owner/name), PR_NUMBER, PYTHON (the interpreter
# cudagate is installed in, run isolated: -I), and optionally REPORT_URL (link to the HTML report),
# COMMENT_ID (cudagate report comment --id), AUTHOR (the token's login, default github-actions[bot]).
# Needs gh and jq on PATH; run it outside any checkout (the actions run it in runner.temp).
set -euo pipefail

report=${1:?usage: post.sh REPORT_DIR}
author=${AUTHOR:-github-actions[bot]}
fail() { echo "::error title=cudagate comment::$1" >&2; exit 2; }

[[ ${REPO:-} =~ ^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$ ]] || fail "REPO '${REPO:-}' is not owner/name"
[[ ${PR_NUMBER:-} =~ ^[1-9][0-9]*$ ]] ||
  fail "PR_NUMBER '${PR_NUMBER:-}' is not a pull request number: comment on pull_request or pull_request_target events"
[[ ${PYTHON:-} == /* ]] || fail "PYTHON '${PYTHON:-}' is not an absolute path: name the interpreter cudagate is installed in"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(--out "$work/comment.md")
if [ -n "${REPORT_URL:-}" ]; then args+=(--report-url "$REPORT_URL"); fi
if [ -n "${COMMENT_ID:-}" ]; then args+=(--id "$COMMENT_ID"); fi
# The token stays out of the process that reads the report.
env -u GH_TOKEN "$PYTHON" -I -m pytest_cudagate.cli report comment "$report" "${args[@]}"
marker=$(head -n 1 "$work/comment.md")
jq -Rs '{body: .}' "$work/comment.md" > "$work/body.json"

# Every page of the pull request's comments (gh prints one JSON array per page); the oldest match wins.
existing=$(gh api --paginate "repos/$REPO/issues/$PR_NUMBER/comments?per_page=100" |
  jq -rn --arg marker "$marker" --arg author "$author" '
    [inputs[] | select(.user.login == $author and ((.body // "") | split("\n")[0] | rtrimstr("\r")) == $marker) | .id]
    | first // empty')
if [ -n "$existing" ]; then
  gh api --method PATCH "repos/$REPO/issues/comments/$existing" --input "$work/body.json" > /dev/null
  echo "updated comment $existing on $REPO#$PR_NUMBER"
else
  gh api --method POST "repos/$REPO/issues/$PR_NUMBER/comments" --input "$work/body.json" > /dev/null
  echo "posted a comment on $REPO#$PR_NUMBER"
fi

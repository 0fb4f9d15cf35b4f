#!/bin/sh
# help2man's view of one dtrain command: this file is copied as
# man/dtrain-CMD and runs "$DTRAIN CMD --help" (and "$DTRAIN --version").
cmd=${0##*/dtrain-}
case "${1:-}" in --version) exec "$DTRAIN" --version ;; esac
exec "$DTRAIN" "$cmd" "$@"

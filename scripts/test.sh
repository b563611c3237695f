#!/usr/bin/env bash
# The project's test command: installs the servers if missing, then format,
# lint (benches included), docs, every test, and the quick start.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step says what it cost, and the end sums them up, so a cold run
# shows where its minutes go.
timings=()
step_started=$SECONDS
step_name=""
step() {
    if [ -n "$step_name" ]; then
        timings+=("$(printf '%5ds  %s' $((SECONDS - step_started)) "$step_name")")
    fi
    step_name="$1"
    step_started=$SECONDS
    [ -z "$1" ] || echo "== $1"
}

step "install-servers"
./scripts/install-servers.sh

# Tools the checks need (present on a machine of this kind; added when not).
rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "cargo doc (default features and all features)"
# Rustdoc's warnings fail by -D warnings; cargo's own (an output filename
# collision, where one crate's pages overwrite another's) only print, so
# any warning line fails the step too.
for features in "" "--all-features"; do
    doclog=$(mktemp)
    # shellcheck disable=SC2086
    RUSTDOCFLAGS="-D warnings" cargo doc --workspace $features --no-deps --quiet 2>&1 | tee "$doclog"
    if grep -q '^warning' "$doclog"; then
        echo "cargo doc ${features}: warnings (see above)" >&2
        exit 1
    fi
    rm -f "$doclog"
done

step "cargo test"
log=$(mktemp)
# The same tests as `cargo test --workspace --all-features`, two binaries
# at a time (DISTLOCK_TEST_JOBS): see scripts/run-tests.py.
python3 scripts/run-tests.py 2>&1 | tee "$log"
read -r passed failed < <(awk '/^test result:/ {
    for (i = 1; i <= NF; i++) { if ($i ~ /^passed/) p += $(i-1); if ($i ~ /^failed/) f += $(i-1) }
} END { print p + 0, f + 0 }' "$log")
rm -f "$log"

# The benches are type-checked by clippy above (--all-targets); their
# release build (10 of a cold run's minutes) is left to whoever runs them.

step "quickstart"
# `cargo test` above built the example (with every feature, as it builds
# all targets): run that binary rather than build core and facade a second
# time under another feature set only to run it.
"${CARGO_TARGET_DIR:-target}/debug/examples/quickstart" >/dev/null

step ""
echo "test.sh: all checks passed"
echo "tests: ${passed} passed, ${failed} failed"
echo "time per step:"
printf '%s\n' "${timings[@]}"

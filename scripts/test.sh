#!/usr/bin/env bash
# The project's test command: installs the servers if missing, then format,
# lint, docs, every test, and a compile of the benches.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-servers.sh

# Tools the checks need (present on a machine of this kind; added when not).
rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --all-features -- -D warnings

echo "== cargo doc (default features and all features)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps --quiet

echo "== cargo test"
log=$(mktemp)
cargo test --workspace --all-features 2>&1 | tee "$log"
read -r passed failed < <(awk '/^test result:/ {
    for (i = 1; i <= NF; i++) { if ($i ~ /^passed/) p += $(i-1); if ($i ~ /^failed/) f += $(i-1) }
} END { print p + 0, f + 0 }' "$log")
rm -f "$log"

echo "== cargo bench --no-run"
cargo bench --workspace --no-run --quiet

echo "== quickstart"
cargo run --quiet --example quickstart >/dev/null

echo "test.sh: all checks passed"
echo "tests: ${passed} passed, ${failed} failed"

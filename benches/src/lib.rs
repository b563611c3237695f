//! Criterion benches of distlock (`cargo bench -p distlock-benches`). The
//! library part is empty; the benches live in `benches/`.

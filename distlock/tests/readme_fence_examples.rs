//! The README's fencing programs are the compiled examples, verbatim.

#[test]
fn the_readme_shows_the_compiled_fence_examples() {
    let readme = include_str!("../../README.md");
    for (name, source) in [
        ("fence_redis", include_str!("../examples/fence_redis.rs")),
        (
            "fence_postgres",
            include_str!("../examples/fence_postgres.rs"),
        ),
        ("fence_http", include_str!("../examples/fence_http.rs")),
    ] {
        let block = format!("```rust,ignore\n{source}```\n");
        assert!(
            readme.contains(&block),
            "README.md does not show examples/{name}.rs as it is"
        );
    }
}

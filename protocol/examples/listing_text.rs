//! What the model's text of a 1,000-entry listing costs to write (`render::text`, as
//! `monad-client mcp` writes it for every `list_dir` answer): the best of 20 rounds of 200,
//! per listing, for plain names and for names the text must escape (`@`, `\u{`, U+FFFD).
//!
//! `cargo run --release -p monad-protocol --example listing_text`; see `docs/benchmarks.md`.

use monad_protocol::ToolName;

fn per_listing(names: impl Fn(usize) -> String) -> f64 {
    let entries: Vec<_> = (0..1000)
        .map(|i| serde_json::json!({"path": format!("many/{}", names(i)), "kind": "file"}))
        .collect();
    let result = serde_json::json!({"path": "many", "truncated": false, "entries": entries});
    let mut best = f64::MAX;
    for _ in 0..20 {
        let start = std::time::Instant::now();
        for _ in 0..200 {
            std::hint::black_box(monad_protocol::render::text(
                ToolName::ListDir,
                None,
                &result,
            ));
        }
        best = best.min(start.elapsed().as_secs_f64() / 200.0 * 1e6);
    }
    best
}

fn main() {
    let plain = per_listing(|i| format!("f{i:04}.txt"));
    let odd = per_listing(|i| format!("f{i:04}@\\u{{x}}\u{FFFD}.txt"));
    println!(
        "list_dir text, 1,000 entries: plain names {plain:.1} us, names to escape {odd:.1} us"
    );
}

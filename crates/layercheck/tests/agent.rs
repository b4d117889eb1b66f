//! The agent's modules import only from their own layer or below, as
//! crates/agent/layers.txt orders them, and no two of them import each
//! other, directly or around a cycle.

use std::path::Path;

use trapline_layercheck::{cycles, graph, read_modules, violations, Graph, Layers};

fn agent() -> (Graph, Layers) {
    let agent = Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent");
    let modules = read_modules(&agent.join("src")).unwrap();
    let layers = std::fs::read_to_string(agent.join("layers.txt")).unwrap();
    (graph(&modules).unwrap(), Layers::parse(&layers).unwrap())
}

#[test]
fn the_agents_modules_import_only_downward_and_form_no_cycle() {
    let (graph, layers) = agent();
    let found = violations(&graph, &layers, "");
    assert!(
        found.is_empty(),
        "{} violations:\n{}",
        found.len(),
        found.join("\n")
    );
}

/// The checker itself: a planted upward import and a planted cycle are
/// found, and a declaration or a test module is not an import.
#[test]
fn an_upward_import_and_a_cycle_are_found() {
    let modules = [
        ("", "mod low; mod high;"),
        (
            "low",
            "pub fn f() { crate::high::g() }\n#[cfg(test)]\nmod tests { use crate::high; }",
        ),
        (
            "high",
            "use crate::low::{self, f};\npub fn g() { assert!(crate::low::f() == ()) }",
        ),
    ]
    .into_iter()
    .map(|(m, s)| (m.to_owned(), s.to_owned()))
    .collect();
    let graph = graph(&modules).unwrap();
    assert_eq!(graph["low"].iter().collect::<Vec<_>>(), ["high"]);
    assert_eq!(graph["high"].iter().collect::<Vec<_>>(), ["low"]);
    assert!(graph[""].is_empty());
    assert_eq!(cycles(&graph), [["high", "low"]]);
    let layers = Layers::parse("bottom: low gone\ntop: high # comment\n").unwrap();
    assert_eq!(
        violations(&graph, &layers, ""),
        [
            "low (bottom) imports high (top), a higher layer",
            "layer bottom names gone, which is no module",
            "modules importing one another around a cycle: high, low"
        ]
    );
}

//! No crate's source files import each other around a circle: helpers that
//! two files share live below both (issue 45's house rule, beyond the
//! agent's layer table).

use std::path::Path;

use trapline_layercheck::{cycles, graph, read_modules};

#[test]
fn no_files_of_any_crate_import_each_other_around_a_circle() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    let mut dirs: Vec<_> = std::fs::read_dir(&crates)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("src").is_dir())
        .collect();
    dirs.sort();
    assert!(dirs.len() > 10, "{dirs:?}");
    for dir in dirs {
        let modules = read_modules(&dir.join("src")).unwrap();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        for cycle in cycles(&graph(&modules).unwrap()) {
            found.push(format!("{name}: {}", cycle.join(" <-> ")));
        }
    }
    assert!(
        found.is_empty(),
        "{} circles:\n{}",
        found.len(),
        found.join("\n")
    );
}

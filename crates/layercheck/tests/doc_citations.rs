//! Every citation of a design document by heading resolves: code, tests,
//! scripts and documents cite a part of docs/ as `agent.md, "Trampolines"`
//! (docs/README.md), and a document cites a part of another with the
//! other's file name, its own parts by heading alone.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Each document of docs/ with its headings.
fn headings() -> BTreeMap<String, BTreeSet<String>> {
    let mut docs = BTreeMap::new();
    for entry in std::fs::read_dir(repo().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let heads = text
            .lines()
            .filter(|l| l.starts_with('#'))
            .filter_map(|l| l.trim_start_matches('#').strip_prefix(' '))
            .map(str::to_owned)
            .collect();
        docs.insert(
            path.file_name().unwrap().to_string_lossy().into_owned(),
            heads,
        );
    }
    docs
}

/// The project's text files (no build output, no fetched packages, no
/// benchmark data rows, which quote old notes).
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !matches!(name.as_str(), "target" | "node_modules" | ".git") {
                sources(&path, out);
            }
        } else if [".rs", ".c", ".h", ".md", ".toml", ".sh", ".py", ".js"]
            .iter()
            .any(|e| name.ends_with(e))
            || name == "run"
        {
            out.push(path);
        }
    }
}

/// `(file, heading)` for every `FILE.md, "HEADING"` or `FILE.md, section
/// "HEADING"` in `text`, the heading's line breaks (and the comment
/// markers after them) read as spaces.
fn citations(text: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(i) = text[at..].find(".md,") {
        let dot = at + i;
        at = dot + 4;
        let start = text[..dot]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .map_or(0, |s| s + 1);
        // bench/README.md's own parts are cited from bench/ as README.md.
        if &text[start..dot] == "README" && !text[..start].ends_with("docs/") {
            continue;
        }
        let file = format!("{}.md", &text[start..dot]);
        let rest = skip_comment_space(&text[at..]);
        let rest = rest.strip_prefix("section ").unwrap_or(rest);
        let Some(quoted) = rest.strip_prefix('"') else {
            continue;
        };
        let Some(end) = quoted.find('"') else {
            continue;
        };
        let heading = quoted[..end]
            .split('\n')
            .map(|l| l.trim().trim_start_matches(['/', '!', '#', '*']).trim())
            .collect::<Vec<_>>()
            .join(" ");
        found.push((file, heading));
    }
    found
}

/// `text` from its first character that is no white space and no comment
/// marker (a citation may break its line in a comment).
fn skip_comment_space(text: &str) -> &str {
    text.trim_start_matches(|c: char| c.is_whitespace() || "/!#*".contains(c))
}

#[test]
fn every_citation_of_a_document_names_one_of_its_headings() {
    let docs = headings();
    assert!(docs.contains_key("agent.md") && docs.contains_key("README.md"));
    let mut files = Vec::new();
    sources(&repo(), &mut files);
    let mut broken = Vec::new();
    let mut checked = 0;
    for path in files {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let shown = path
            .strip_prefix(repo())
            .unwrap_or(&path)
            .display()
            .to_string();
        for (file, heading) in citations(&text) {
            if file == "design.md" {
                broken.push(format!(
                    "{shown}: design.md is split (docs/README.md): \"{heading}\""
                ));
                continue;
            }
            let Some(heads) = docs.get(&file) else {
                continue; // another file's name (RESULTS.md, ...)
            };
            checked += 1;
            if !heads.contains(&heading) {
                broken.push(format!("{shown}: {file} has no heading \"{heading}\""));
            }
        }
    }
    assert!(checked > 30, "only {checked} citations found");
    assert_none_broken(&broken);
}

/// A document cites its own parts by heading alone: a quoted heading that
/// is another document's only must carry that document's name.
#[test]
fn a_documents_bare_citations_are_its_own_headings() {
    let docs = headings();
    let mut broken = Vec::new();
    for (file, heads) in &docs {
        let text = std::fs::read_to_string(repo().join("docs").join(file)).unwrap();
        let pieces: Vec<&str> = text.split('"').collect();
        for (i, quoted) in pieces.iter().enumerate() {
            // Odd pieces are quoted; a heading may break its line.
            let piece = quoted.split_whitespace().collect::<Vec<_>>().join(" ");
            if i % 2 == 0 || heads.contains(&piece) {
                continue;
            }
            let before = pieces[i - 1].trim_end();
            let before = before.strip_suffix("section").unwrap_or(before).trim_end();
            // A JSON key or value (`{"exec": true}`) is no citation.
            if before.ends_with(".md,") || before.ends_with(['{', '[', ',', ':']) {
                continue;
            }
            let elsewhere: Vec<&String> = docs
                .iter()
                .filter(|(_, h)| h.contains(&piece))
                .map(|(f, _)| f)
                .collect();
            if !elsewhere.is_empty() {
                broken.push(format!("{file}: \"{piece}\" is a heading of {elsewhere:?}"));
            }
        }
    }
    assert_none_broken(&broken);
}

fn assert_none_broken(broken: &[String]) {
    assert!(
        broken.is_empty(),
        "{} broken:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn citations_are_read_across_comment_lines() {
    let text = "see (agent.md,\n/// \"The other threads held\n/// through the finish\") and x.md, section \"A\"";
    assert_eq!(
        citations(text),
        [
            (
                "agent.md".to_owned(),
                "The other threads held through the finish".to_owned()
            ),
            ("x.md".to_owned(), "A".to_owned())
        ]
    );
}

/// Each document reads in one sitting, and the README stays an overview.
#[test]
fn documents_stay_short() {
    let lines = |p: &Path| std::fs::read_to_string(p).unwrap().lines().count();
    for (file, _) in headings() {
        let n = lines(&repo().join("docs").join(&file));
        assert!(n <= 700, "docs/{file} has {n} lines, over 700: split it");
    }
    let n = lines(&repo().join("README.md"));
    assert!(
        n <= 200,
        "README.md has {n} lines, over 200: move details to docs/"
    );
    let n = lines(&repo().join("bench/README.md"));
    assert!(
        n <= 300,
        "bench/README.md has {n} lines, over 300: a paragraph a benchmark"
    );
}

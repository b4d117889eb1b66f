//! The agent's module graph, read from its source, checked against its
//! layer table (crates/agent/layers.txt).
//!
//! A module is a source file (`scan/world.rs` is `scan::world`). Module A
//! imports B when A's code, outside `#[cfg(test)]` items, names a path
//! that resolves into B: `crate::b::..`, `super::..`, `self::..`, or a
//! child module's name. Paths inside macro invocations count too: they are
//! read as tokens. Declaring a child (`mod b;`) is not an import.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use proc_macro2::{TokenStream, TokenTree};
use quote::ToTokens;

/// Module path ("" for the crate root) -> the modules it imports.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// Reads every `.rs` file under `src` into its module path and source.
pub fn read_modules(src: &Path) -> std::io::Result<BTreeMap<String, String>> {
    let mut modules = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path
                .strip_prefix(src)
                .expect("under src")
                .with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
                parts.pop();
            }
            modules.insert(parts.join("::"), std::fs::read_to_string(&path)?);
        }
    }
    Ok(modules)
}

/// The import graph of `modules` (as `read_modules` returns them).
pub fn graph(modules: &BTreeMap<String, String>) -> Result<Graph, String> {
    let names: BTreeSet<&str> = modules.keys().map(String::as_str).collect();
    let mut graph = Graph::new();
    for (module, source) in modules {
        let file = syn::parse_file(source).map_err(|e| format!("{module}: {e}"))?;
        let mut tokens = TokenStream::new();
        for item in file.items.iter().filter(|i| !is_test_only(i)) {
            item.to_tokens(&mut tokens);
        }
        let mut paths = Vec::new();
        collect_paths(tokens, &mut paths);
        let imports = graph.entry(module.clone()).or_default();
        for path in paths {
            if let Some(target) = resolve(module, &path, &names) {
                if target != *module {
                    imports.insert(target);
                }
            }
        }
    }
    Ok(graph)
}

/// `#[cfg(test)]` items: the unit tests may reach anywhere.
fn is_test_only(item: &syn::Item) -> bool {
    let attrs = match item {
        syn::Item::Mod(m) => &m.attrs,
        syn::Item::Fn(f) => &f.attrs,
        syn::Item::Use(u) => &u.attrs,
        syn::Item::Impl(i) => &i.attrs,
        _ => return false,
    };
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta.to_token_stream().to_string().replace(' ', "") == "cfg(test)"
    })
}

/// Every `a::b::c` sequence of identifiers in `tokens`, with `use` groups
/// (`crate::{a, b::c}`) expanded.
fn collect_paths(tokens: TokenStream, out: &mut Vec<Vec<String>>) {
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < trees.len() {
        if let TokenTree::Group(g) = &trees[i] {
            collect_paths(g.stream(), out);
            i += 1;
            continue;
        }
        let TokenTree::Ident(first) = &trees[i] else {
            i += 1;
            continue;
        };
        let mut path = vec![first.to_string()];
        let mut j = i + 1;
        while is_path_sep(&trees, j) {
            match trees.get(j + 2) {
                Some(TokenTree::Ident(next)) => {
                    path.push(next.to_string());
                    j += 3;
                }
                Some(TokenTree::Group(g)) if g.delimiter() == proc_macro2::Delimiter::Brace => {
                    // A use group: each member continues the prefix.
                    let mut members = Vec::new();
                    collect_paths(g.stream(), &mut members);
                    for m in members {
                        out.push(path.iter().cloned().chain(m).collect());
                    }
                    j += 3;
                    break;
                }
                _ => break,
            }
        }
        if path.len() > 1 {
            out.push(path);
        }
        i = j.max(i + 1);
    }
}

fn is_path_sep(trees: &[TokenTree], j: usize) -> bool {
    matches!(
        (trees.get(j), trees.get(j + 1)),
        (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
            if a.as_char() == ':' && b.as_char() == ':'
                && a.spacing() == proc_macro2::Spacing::Joint
    )
}

/// The module `path`, named in `module`, lands in: the longest module
/// prefix of its absolute form.
fn resolve(module: &str, path: &[String], names: &BTreeSet<&str>) -> Option<String> {
    let here: Vec<&str> = if module.is_empty() {
        vec![]
    } else {
        module.split("::").collect()
    };
    let mut absolute: Vec<&str> = match path[0].as_str() {
        "crate" => vec![],
        "self" => here.clone(),
        "super" => here[..here.len().checked_sub(1)?].to_vec(),
        _ => {
            let mut child = here.clone();
            child.push(&path[0]);
            if !names.contains(child.join("::").as_str()) {
                return None;
            }
            here.clone()
        }
    };
    let mut rest = &path[usize::from(matches!(path[0].as_str(), "crate" | "self" | "super"))..];
    while rest.first().is_some_and(|s| s == "super") {
        absolute.pop();
        rest = &rest[1..];
    }
    absolute.extend(rest.iter().map(String::as_str));
    (1..=absolute.len())
        .rev()
        .map(|n| absolute[..n].join("::"))
        .find(|candidate| names.contains(candidate.as_str()))
}

/// The layer table: layer names, lowest first, each with the module paths
/// (prefixes) it holds.
pub struct Layers {
    layers: Vec<(String, Vec<String>)>,
}

impl Layers {
    /// Parses lines of `layer: module module ...`; `#` starts a comment.
    pub fn parse(text: &str) -> Result<Layers, String> {
        let mut layers = Vec::new();
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let (name, modules) = line
                .split_once(':')
                .ok_or_else(|| format!("not `layer: modules`: {line}"))?;
            let modules = modules.split_whitespace().map(str::to_owned).collect();
            layers.push((name.trim().to_owned(), modules));
        }
        Ok(Layers { layers })
    }

    /// The rank and name of the layer holding `module` (longest prefix).
    pub fn of(&self, module: &str) -> Option<(usize, &str)> {
        let mut best: Option<(usize, usize, &str)> = None;
        for (rank, (name, prefixes)) in self.layers.iter().enumerate() {
            for p in prefixes {
                let holds = module == p || module.starts_with(&format!("{p}::"));
                if holds && best.is_none_or(|(len, _, _)| p.len() > len) {
                    best = Some((p.len(), rank, name));
                }
            }
        }
        best.map(|(_, rank, name)| (rank, name))
    }
}

/// What breaks the rule: modules in no layer, imports of a higher layer,
/// and cycles; one line each.
pub fn violations(graph: &Graph, layers: &Layers, root: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (module, imports) in graph {
        if module == root {
            continue;
        }
        let Some((rank, layer)) = layers.of(module) else {
            found.push(format!("{module}: in no layer of the table"));
            continue;
        };
        for target in imports {
            if let Some((to_rank, to_layer)) = layers.of(target) {
                if to_rank > rank {
                    found.push(format!(
                        "{module} ({layer}) imports {target} ({to_layer}), a higher layer"
                    ));
                }
            }
        }
    }
    for (name, prefixes) in &layers.layers {
        for p in prefixes {
            let exists = graph
                .keys()
                .any(|m| m == p || m.starts_with(&format!("{p}::")));
            if !exists {
                found.push(format!("layer {name} names {p}, which is no module"));
            }
        }
    }
    for cycle in cycles(graph) {
        found.push(format!(
            "modules importing one another around a cycle: {}",
            cycle.join(", ")
        ));
    }
    found
}

/// The graph's strongly connected components of more than one module,
/// each as its members in order (Tarjan's algorithm, iterative).
pub fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    let nodes: Vec<&String> = graph.keys().collect();
    let index_of: BTreeMap<&String, usize> =
        nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let edges: Vec<Vec<usize>> = nodes
        .iter()
        .map(|n| {
            graph[*n]
                .iter()
                .filter_map(|t| index_of.get(t).copied())
                .collect()
        })
        .collect();
    let n = nodes.len();
    let (mut index, mut low) = (vec![usize::MAX; n], vec![0; n]);
    let (mut on_stack, mut stack, mut next) = (vec![false; n], Vec::new(), 0);
    let mut components = Vec::new();
    for start in 0..n {
        if index[start] != usize::MAX {
            continue;
        }
        let mut work = vec![(start, 0usize)];
        while let Some(&mut (v, ref mut edge)) = work.last_mut() {
            if *edge == 0 && index[v] == usize::MAX {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if let Some(&w) = edges[v].get(*edge) {
                *edge += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.push(nodes[w].clone());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    components.push(component);
                }
            }
        }
    }
    components
}

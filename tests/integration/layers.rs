//! The layering of `src/` (ARCHITECTURE.md §2), checked on the sources: a
//! module names only modules of its own layer or lower ones, and modules of
//! one layer never name each other both ways. References are `crate::NAME`
//! paths and `use crate::{…}` lists in code (comments and doc links aside).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::common::repo_root;

/// Every top-level module and its layer, as the crate docs list them.
const LAYERS: &[(&str, u8)] = &[
    ("cli", 5),
    ("command", 5),
    ("app", 4),
    ("bench", 4),
    ("summary", 4),
    ("consumer", 4),
    ("session", 3),
    ("event_loop", 3),
    ("config", 2),
    ("sources", 2),
    ("control", 2),
    ("ipc", 2),
    ("privilege", 2),
    ("storage", 1),
    ("trace", 1),
    ("ringbuf", 0),
    ("sys", 0),
    ("clock", 0),
    ("protos", 0),
    ("wire", 0),
    ("bytes", 0),
];

fn layer(name: &str) -> Option<u8> {
    LAYERS.iter().find(|(n, _)| *n == name).map(|(_, l)| *l)
}

/// The code of a Rust file with comments blanked (line comments, doc
/// comments and block comments; string contents are kept, which is
/// harmless here).
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("//") {
            rest = r.find('\n').map_or("", |i| &r[i..]);
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r.find("*/").map_or("", |i| &r[i + 2..]);
        } else {
            let c = rest.chars().next().expect("non-empty");
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// The top-level modules a file's code names.
fn named_modules(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        let after = &code[i + "crate::".len()..];
        if let Some(list) = after.strip_prefix('{') {
            // `use crate::{a::x, b, c::{y, z}}`: the first segment of each
            // top-level entry.
            let mut depth = 0;
            let mut at_entry = true;
            for (j, c) in list.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => at_entry = true,
                    c if at_entry && (c.is_ascii_alphabetic() || c == '_') => {
                        names.insert(ident(&list[j..]));
                        at_entry = false;
                    }
                    _ => {}
                }
            }
        } else {
            names.insert(ident(after));
        }
    }
    names
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).expect("src readable").flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Which top-level modules each module names, with a file that does.
fn module_graph() -> BTreeMap<String, BTreeMap<String, String>> {
    let src = repo_root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&src).expect("under src");
        let first = rel.components().next().expect("a component");
        let module = first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if layer(&module).is_none() {
            continue; // lib.rs, main.rs
        }
        let code = code_of(&std::fs::read_to_string(&f).expect("readable"));
        for name in named_modules(&code) {
            if name != module && layer(&name).is_some() {
                graph
                    .entry(module.clone())
                    .or_default()
                    .entry(name)
                    .or_insert_with(|| rel.display().to_string());
            }
        }
    }
    graph
}

#[test]
fn every_module_of_src_has_a_layer() {
    for e in std::fs::read_dir(repo_root().join("src"))
        .expect("src")
        .flatten()
    {
        let name = e
            .file_name()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        assert!(
            layer(&name).is_some() || name == "lib" || name == "main",
            "src/{name} has no layer: add it to ARCHITECTURE.md §2 and to LAYERS"
        );
    }
}

#[test]
fn modules_name_only_their_layer_or_lower_and_never_each_other_both_ways() {
    let graph = module_graph();
    assert!(
        graph.get("command").is_some_and(|n| n.contains_key("cli")),
        "the scan finds the known reference command → cli: {graph:?}"
    );
    let mut problems = Vec::new();
    for (m, names) in &graph {
        let lm = layer(m).expect("a layer");
        for (n, file) in names {
            let ln = layer(n).expect("a layer");
            if ln > lm {
                problems.push(format!(
                    "{m} (layer {lm}) names {n} (layer {ln}) in src/{file}"
                ));
            }
            if ln == lm
                && m < n
                && let Some(back) = graph.get(n).and_then(|b| b.get(m))
            {
                problems.push(format!(
                    "{m} and {n} name each other: src/{file} and src/{back}"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_scan_sees_through_comments_and_use_lists() {
    let code = code_of(
        "// crate::a\n/* crate::b */ use crate::{c::x, d, e::{f, g}};\nlet v = crate::h::y; /// crate::i\n",
    );
    let names: Vec<String> = named_modules(&code).into_iter().collect();
    assert_eq!(names, ["c", "d", "e", "h"]);
}

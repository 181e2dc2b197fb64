//! The layering of `src/` (ARCHITECTURE.md §2), checked on the sources: a
//! module names only modules of its own layer or lower ones, and modules of
//! one layer never name each other both ways. References are `crate::NAME`
//! paths and `use crate::{…}` lists in code (comments and doc links aside).

use crate::harness::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

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
    ("producer", 2),
    ("privilege", 2),
    ("storage", 1),
    ("trace", 1),
    ("transport", 1),
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

/// The invariant names a `// SAFETY:` comment cites (`M1`, `PV2`, …): the
/// comment runs from `SAFETY:` to the last `//` line after it.
fn cited_invariants(text: &str) -> BTreeSet<String> {
    let mut cited = BTreeSet::new();
    let mut in_safety = false;
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("//") && t.contains("SAFETY:") {
            in_safety = true;
        } else if !t.starts_with("//") {
            in_safety = false;
        }
        if in_safety {
            cited.extend(invariant_names(t));
        }
    }
    cited
}

/// Words of the form one to three capitals then digits (`S1`, `NW2`).
fn invariant_names(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| {
            let letters = w.chars().take_while(char::is_ascii_uppercase).count();
            (1..=3).contains(&letters)
                && w.len() > letters
                && w[letters..].chars().all(|c| c.is_ascii_digit())
        })
        .map(str::to_string)
        .collect()
}

/// Every invariant ARCHITECTURE.md defines, with how many times: a
/// definition is bold, alone (`**M1**`), a range (`**C1–C3**`) or opening
/// a titled line (`**PR1 Buffer ids are the service's.**`).
fn defined_invariants(doc: &str) -> BTreeMap<String, usize> {
    let mut defined = BTreeMap::new();
    for bold in doc.split("**").skip(1).step_by(2) {
        let head = bold.split(' ').next().unwrap_or("");
        let names: Vec<String> = match head.split_once('–') {
            Some((a, b)) => {
                let (pa, na) = split_name(a);
                let (pb, nb) = split_name(b);
                match (na, nb) {
                    (Some(na), Some(nb)) if pa == pb && !pa.is_empty() => {
                        (na..=nb).map(|n| format!("{pa}{n}")).collect()
                    }
                    _ => Vec::new(),
                }
            }
            None => invariant_names(head)
                .into_iter()
                .filter(|n| n == head)
                .collect(),
        };
        for n in names {
            *defined.entry(n).or_insert(0) += 1;
        }
    }
    defined
}

fn split_name(name: &str) -> (&str, Option<u32>) {
    let letters = name.chars().take_while(char::is_ascii_uppercase).count();
    (&name[..letters], name[letters..].parse().ok())
}

#[test]
fn every_invariant_a_safety_comment_cites_is_defined_once() {
    let doc = std::fs::read_to_string(repo_root().join("ARCHITECTURE.md")).expect("doc");
    let defined = defined_invariants(&doc);
    let twice: Vec<_> = defined.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "defined more than once: {twice:?}");
    let mut files = Vec::new();
    rust_files(&repo_root().join("src"), &mut files);
    let mut missing = Vec::new();
    let mut cited_any = 0;
    for f in files {
        let text = std::fs::read_to_string(&f).expect("readable");
        for name in cited_invariants(&text) {
            cited_any += 1;
            if !defined.contains_key(&name) {
                missing.push(format!("{name} in {}", f.display()));
            }
        }
    }
    assert!(cited_any > 20, "the scan finds the SAFETY citations");
    assert!(
        missing.is_empty(),
        "cited in a SAFETY comment, not defined in ARCHITECTURE.md §5: {missing:?}"
    );
}

#[test]
fn invariant_definitions_and_citations_are_read_as_written() {
    let defined =
        defined_invariants("- **C1–C3** x\n- **M5** (`a`)\n- **PR1 Title.** y **bold words**");
    let names: Vec<&str> = defined.keys().map(String::as_str).collect();
    assert_eq!(names, ["C1", "C2", "C3", "M5", "PR1"]);
    let cited = cited_invariants("// SAFETY: M1 — x\n// and (TM4, U2).\nlet a = 1; // R9\n");
    let cited: Vec<&str> = cited.iter().map(String::as_str).collect();
    assert_eq!(cited, ["M1", "TM4", "U2"]);
}

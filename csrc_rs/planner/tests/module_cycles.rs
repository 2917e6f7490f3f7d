//! The crate's modules depend on each other without cycles.
//!
//! Reads `src/`, maps each file to its module path, collects the paths
//! each module names (`crate::...`, `super::...`, `self::...` and paths
//! starting with one of its own submodules, in `use` items and in code) and
//! checks, for the crate's top-level modules and for the submodules of each
//! module (the module itself included, each submodule with everything under
//! it counted as one), that the dependencies form no cycle. Comments are
//! left out, so doc links do not count; `lib.rs` (the crate root, which
//! declares and re-exports everything) is not a node.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

type ModPath = Vec<String>;

/// Every module file under `dir`, by module path (`lib.rs` is `[]`).
fn module_files(dir: &Path, prefix: &[String], out: &mut BTreeMap<ModPath, String>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .expect("src/ is readable")
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            let mut sub = prefix.to_vec();
            sub.push(name);
            module_files(&path, &sub, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let mut module = prefix.to_vec();
            if !(name == "mod" || (prefix.is_empty() && name == "lib")) {
                module.push(name);
            }
            out.insert(
                module,
                fs::read_to_string(&path).expect("source is readable"),
            );
        }
    }
}

/// The source without comments, string literals' contents or char literals.
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('x' or an escape); lifetimes have no closing quote.
            i += 2;
            while i < b.len() && b[i] != b'\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            let c = src[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Path, // `::`
    Open,
    Close,
    Comma,
    Star,
    Other,
}

fn tokens(src: &str) -> Vec<Token> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Token::Ident(chars[start..i].iter().collect()));
            continue;
        }
        if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push(Token::Path);
            i += 2;
            continue;
        }
        match c {
            '{' => out.push(Token::Open),
            '}' => out.push(Token::Close),
            ',' => out.push(Token::Comma),
            '*' => out.push(Token::Star),
            c if c.is_whitespace() => {}
            _ => out.push(Token::Other),
        }
        i += 1;
    }
    out
}

/// Expands the path starting at `toks[i]` (an identifier), group syntax
/// included, into full paths; returns them and the index after the path.
fn expand(toks: &[Token], mut i: usize, prefix: &ModPath, out: &mut Vec<ModPath>) -> usize {
    let mut path = prefix.clone();
    loop {
        match toks.get(i) {
            Some(Token::Ident(name)) => {
                path.push(name.clone());
                i += 1;
            }
            Some(Token::Open) => {
                // A use group: `{a::b, c, d::{e, f}}`.
                i += 1;
                loop {
                    match toks.get(i) {
                        Some(Token::Close) => return i + 1,
                        Some(Token::Ident(_)) => i = expand(toks, i, &path, out),
                        Some(_) => i += 1, // a comma or a glob
                        None => return i,
                    }
                }
            }
            _ => break,
        }
        if toks.get(i) == Some(&Token::Path) {
            i += 1;
        } else {
            break;
        }
    }
    out.push(path);
    i
}

/// The module paths `module` (whose source is `src`) names, resolved to
/// absolute paths (not yet cut down to modules).
fn references(module: &ModPath, src: &str, children: &BTreeSet<String>) -> Vec<ModPath> {
    let toks = tokens(&strip(src));
    // Inline modules (`mod tests { ... }`) change what `super` and `self`
    // mean; track them by brace depth.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Token::Open => {
                depth += 1;
                i += 1;
                continue;
            }
            Token::Close => {
                if inline.last().is_some_and(|&(_, d)| d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
                continue;
            }
            Token::Ident(kw) if kw == "mod" => {
                if let (Some(Token::Ident(name)), Some(Token::Open)) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    inline.push((name.clone(), depth + 1));
                }
                i += 1;
                continue;
            }
            _ => {}
        }
        let Token::Ident(first) = &toks[i] else {
            i += 1;
            continue;
        };
        // Only the start of a path: not after `::`, and followed by `::`.
        let after_path = i > 0 && toks[i - 1] == Token::Path;
        if after_path || toks.get(i + 1) != Some(&Token::Path) {
            i += 1;
            continue;
        }
        let mut here = module.clone();
        here.extend(inline.iter().map(|(n, _)| n.clone()));
        let (base, start) = match first.as_str() {
            "crate" => (Vec::new(), i + 2),
            "self" => (here.clone(), i + 2),
            "super" => {
                let mut base = here.clone();
                let mut j = i;
                while toks.get(j) == Some(&Token::Ident("super".into()))
                    && toks.get(j + 1) == Some(&Token::Path)
                {
                    base.pop();
                    j += 2;
                }
                (base, j)
            }
            name if inline.is_empty() && children.contains(name) => (module.clone(), i),
            _ => {
                i += 1;
                continue;
            }
        };
        let mut paths = Vec::new();
        i = expand(&toks, start, &base, &mut paths);
        if matches!(
            toks.get(start),
            Some(Token::Ident(_) | Token::Open | Token::Star)
        ) {
            out.extend(paths);
        }
    }
    out
}

/// The longest known module that `path` starts with.
fn owner(path: &ModPath, modules: &BTreeSet<ModPath>) -> ModPath {
    (0..=path.len())
        .rev()
        .map(|k| path[..k].to_vec())
        .find(|p| modules.contains(p))
        .unwrap_or_default()
}

/// A cycle in `edges`, if any, as the nodes along it (first repeated last).
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), 1);
        stack.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            match state.get(next.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|n| n == next).unwrap();
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(next, edges, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(node.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in edges.keys() {
        if state.get(node.as_str()).copied().unwrap_or(0) == 0 {
            let mut stack = Vec::new();
            if let Some(c) = visit(node, edges, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

/// Every dependency between modules: (from, to), both module paths.
fn dependencies() -> (BTreeSet<ModPath>, BTreeSet<(ModPath, ModPath)>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    module_files(&src, &[], &mut files);
    let modules: BTreeSet<ModPath> = files.keys().cloned().collect();
    let mut deps = BTreeSet::new();
    for (module, text) in &files {
        let children: BTreeSet<String> = modules
            .iter()
            .filter(|m| m.len() == module.len() + 1 && m.starts_with(module))
            .map(|m| m.last().unwrap().clone())
            .collect();
        for path in references(module, text, &children) {
            let to = owner(&path, &modules);
            if to != *module {
                deps.insert((module.clone(), to));
            }
        }
    }
    (modules, deps)
}

/// The graph among `parent` and its children, each child standing for
/// everything under it; dependencies leaving that set are dropped.
fn graph_under(
    parent: &ModPath,
    deps: &BTreeSet<(ModPath, ModPath)>,
) -> BTreeMap<String, BTreeSet<String>> {
    let node = |m: &ModPath| -> Option<String> {
        if !m.starts_with(parent) {
            return None;
        }
        Some(match m.get(parent.len()) {
            None if parent.is_empty() => return None, // the crate root
            None => parent.join("::"),
            Some(child) => {
                let mut p = parent.clone();
                p.push(child.clone());
                p.join("::")
            }
        })
    };
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in deps {
        if let (Some(a), Some(b)) = (node(from), node(to)) {
            if a != b {
                edges.entry(a).or_default().insert(b);
            }
        }
    }
    edges
}

fn show(edges: &BTreeMap<String, BTreeSet<String>>) -> String {
    edges
        .iter()
        .map(|(a, bs)| {
            format!(
                "  {a} -> {}",
                bs.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn top_level_modules_form_no_cycle() {
    let (_, deps) = dependencies();
    let edges = graph_under(&Vec::new(), &deps);
    // The dependencies the planner is built on.
    for (from, to) in [
        ("plan", "simulate"),
        ("plan", "placement"),
        ("simulate", "placement"),
    ] {
        assert!(
            edges.get(from).is_some_and(|t| t.contains(to)),
            "expected {from} -> {to}; found:\n{}",
            show(&edges)
        );
    }
    if let Some(cycle) = find_cycle(&edges) {
        panic!(
            "module cycle: {}\ndependencies:\n{}",
            cycle.join(" -> "),
            show(&edges)
        );
    }
}

#[test]
fn submodules_form_no_cycle() {
    let (modules, deps) = dependencies();
    let parents: BTreeSet<ModPath> = modules
        .iter()
        .filter(|m| !m.is_empty())
        .map(|m| m[..m.len() - 1].to_vec())
        .filter(|p| !p.is_empty())
        .collect();
    assert!(parents.contains(&vec!["plan".to_string()]));
    for parent in &parents {
        let edges = graph_under(parent, &deps);
        if let Some(cycle) = find_cycle(&edges) {
            panic!(
                "module cycle under {}: {}\ndependencies:\n{}",
                parent.join("::"),
                cycle.join(" -> "),
                show(&edges)
            );
        }
    }
}

#[test]
fn the_checker_finds_cycles() {
    let children: BTreeSet<String> = ["search".to_string()].into();
    let src = "use search::{Evaluated, Trial};\n\
               // crate::simulate::run in a comment does not count\n\
               fn f() { let s = \"crate::graph::X\"; crate::device::Device::new(); }\n\
               mod tests { use super::*; use crate::{error::PlanError, hash::{Fnv1a64}}; }";
    let refs = references(&vec!["plan".into()], src, &children);
    let names: BTreeSet<String> = refs.iter().map(|p| p.join("::")).collect();
    let expected: BTreeSet<String> = [
        "plan::search::Evaluated",
        "plan::search::Trial",
        "device::Device::new",
        "error::PlanError",
        "hash::Fnv1a64",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    // `super::*` in `plan::tests` names `plan` itself.
    let names: BTreeSet<String> = names.into_iter().filter(|n| n != "plan").collect();
    assert_eq!(names, expected);

    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    edges.entry("a".into()).or_default().insert("b".into());
    edges.entry("b".into()).or_default().insert("c".into());
    assert_eq!(find_cycle(&edges), None);
    edges.entry("c".into()).or_default().insert("a".into());
    assert_eq!(
        find_cycle(&edges),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}

//! The library's files import each other in layers, without circles.
//!
//! The layers, lowest first: plain types and policy (`job`, `outcome`,
//! `options`, `error`, `backend/params.rs`, `limits`, `flow`, `batch`,
//! `sequence`, `inspect`'s types, and every other file of `src/` not named
//! below) → the backend seam and each database's code (`src/backend/`) →
//! the engine (`queue/`, `worker/`, `periodic/`, `copy`, `events`) → the
//! public faces (`lib.rs`, `sqlite/`, `postgres.rs`, `mysql.rs`, `testing`,
//! `metrics`, the adapters: `sqlx/`, `diesel`, `async_queue`,
//! `app_transaction`; `adapter_flow`, the adapters' one enqueue decided
//! once, is policy). Inside a database's folder, its statements
//! (`queries.rs`, `queries/`) are below its concerns (every other file),
//! which are below its `mod.rs`. A file may name a file of its own layer or
//! of a lower one; an import from a lower layer to a higher one is an arrow
//! that runs back up, and this test lists them. Inside a layer, an import
//! that runs back closes a circle, which this test finds too.
//!
//! The graph is read from the source text, not from the compiler: a file
//! points at another when it names it by a `crate::`, `super::` or `self::`
//! path (in code or in a doc link), or in a `use crate::{..}`,
//! `use super::{..}` or `use self::{..}` group. Paths through the crate
//! root's re-exports (`crate::Queue`) name no file, and a `#[cfg(test)] mod
//! tests` at the end of a file is left out. This is the graph issue 21's
//! script (`graph.py`) builds, and more: that script reads `crate::{..}`
//! groups only, and so missed, for one, SQLite's `batches.rs` naming
//! `jobs.rs` (`use super::{jobs, ..}`) while `jobs.rs` named `batches.rs`.
//!
//! A second test holds every file of `src/` to at most [`MAX_LINES`] lines
//! (issue 21): a file that grows past it holds two concepts, and is split
//! along them.
//!
//! `BACKLOG_LAYERING_SRC` points the tests at another tree's `src/`, e.g. a
//! checkout of an older commit, to see what they would report there.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Circles known and left for now, each with why. The test fails when one
/// of them changes or goes, so that this list only ever shrinks.
const KNOWN: &[(&[&str], &str)] = &[];

/// Arrows that run back up, known and left for now, each with why: file,
/// the file it names. The test fails when one of them goes, so that this
/// list only ever shrinks.
const KNOWN_UP: &[(&str, &str, &str)] = &[];

/// The most lines a file of `src/` may have.
const MAX_LINES: usize = 800;

/// The library's `src/`, or the tree `BACKLOG_LAYERING_SRC` names.
fn source_root() -> PathBuf {
    std::env::var_os("BACKLOG_LAYERING_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

#[test]
fn no_file_of_the_library_is_over_800_lines() {
    let root = source_root();
    let mut files = Vec::new();
    walk(&root, &mut files);
    assert!(!files.is_empty(), "no .rs files under {}", root.display());
    let over: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let text = fs::read_to_string(root.join(file)).expect("read a source file");
            let lines = text.lines().count();
            (lines > MAX_LINES).then(|| format!("{file}: {lines} lines"))
        })
        .collect();
    assert!(
        over.is_empty(),
        "files over {MAX_LINES} lines in {}; split each along a concept:\n{}",
        root.display(),
        over.join("\n")
    );
}

#[test]
fn the_library_imports_in_layers_without_circles() {
    let root = source_root();
    let graph = Graph::read(&root);
    let circles = graph.circles();
    let mut known: Vec<BTreeSet<String>> = KNOWN
        .iter()
        .map(|(files, _)| files.iter().map(|f| f.to_string()).collect())
        .collect();
    let mut report = String::new();
    for circle in &circles {
        if let Some(i) = known.iter().position(|k| k == circle) {
            known.remove(i);
            continue;
        }
        let files: Vec<&str> = circle.iter().map(String::as_str).collect();
        report += &format!(
            "\na circle of {} files: {}\n",
            circle.len(),
            files.join(", ")
        );
        for file in circle {
            for to in &graph.edges[file] {
                if circle.contains(to) {
                    report += &format!("  {file} -> {to}\n");
                }
            }
        }
    }
    let mut known_up: Vec<(&str, &str)> = KNOWN_UP.iter().map(|&(a, b, _)| (a, b)).collect();
    let mut up = 0;
    for (from, tos) in &graph.edges {
        for to in tos {
            if !runs_up(from, to) {
                continue;
            }
            up += 1;
            if let Some(i) = known_up
                .iter()
                .position(|&k| k == (from.as_str(), to.as_str()))
            {
                known_up.remove(i);
                continue;
            }
            report += &format!(
                "\nan arrow runs back up: {from} {:?} -> {to} {:?}\n",
                layer(from),
                layer(to)
            );
        }
    }
    for (from, to) in &known_up {
        report += &format!(
            "\na known arrow up changed or is gone; take it out of KNOWN_UP: {from} -> {to}\n"
        );
    }
    for gone in &known {
        report += &format!(
            "\na known circle changed or is gone; take it out of KNOWN: {:?}\n",
            gone
        );
    }
    assert!(
        report.is_empty(),
        "{} files, {} imports, {} circles, {up} arrows up in {} ({} and {} known):\n{report}",
        graph.edges.len(),
        graph.edges.values().map(BTreeSet::len).sum::<usize>(),
        circles.len(),
        root.display(),
        KNOWN.len(),
        KNOWN_UP.len(),
    );
}

/// The layer of `file` (relative to `src/`), lowest first, as the module
/// doc lays them out: plain types and policy (0), the backend (1), the
/// engine (2), the public faces (3); and inside a database's folder, its
/// statements (0), its concerns (1), its `mod.rs` (2).
fn layer(file: &str) -> (u8, u8) {
    const ENGINE: &[&str] = &["queue/", "worker/", "periodic/", "copy.rs", "events.rs"];
    const FACES: &[&str] = &[
        "lib.rs",
        "sqlite/",
        "postgres.rs",
        "mysql.rs",
        "testing.rs",
        "metrics.rs",
        "sqlx/",
        "diesel.rs",
        "async_queue.rs",
        "app_transaction.rs",
    ];
    let under = |roots: &[&str]| roots.iter().any(|r| file == *r || file.starts_with(r));
    if under(FACES) {
        return (3, 0);
    }
    if under(ENGINE) {
        return (2, 0);
    }
    let Some(rest) = file.strip_prefix("backend/") else {
        return (0, 0);
    };
    if rest == "params.rs" {
        return (0, 0);
    }
    let Some((_, inside)) = database(file) else {
        return (1, 0);
    };
    let place = match inside {
        "queries.rs" => 0,
        _ if inside.starts_with("queries/") => 0,
        "mod.rs" => 2,
        _ => 1,
    };
    (1, place)
}

/// Whether `from` naming `to` runs from a lower layer to a higher one; the
/// places inside a database's folder compare only within that folder.
fn runs_up(from: &str, to: &str) -> bool {
    let (a, b) = (layer(from), layer(to));
    if a.0 != b.0 {
        return a.0 < b.0;
    }
    same_place(from, to) && a.1 < b.1
}

/// The database folder of a file under `backend/`, and its path inside it.
fn database(file: &str) -> Option<(&str, &str)> {
    let rest = file.strip_prefix("backend/")?;
    let (db, inside) = rest.split_once('/')?;
    Some((db, inside))
}

/// Whether two files' minor layers compare: both in one database's folder,
/// or neither in one.
fn same_place(a: &str, b: &str) -> bool {
    database(a).map(|d| d.0) == database(b).map(|d| d.0)
}

/// Files (relative to `src/`) and the files each one names.
struct Graph {
    edges: BTreeMap<String, BTreeSet<String>>,
}

impl Graph {
    fn read(root: &Path) -> Graph {
        let mut files = Vec::new();
        walk(root, &mut files);
        assert!(!files.is_empty(), "no .rs files under {}", root.display());
        // Module path (`backend::sqlite`) -> file (`backend/sqlite/mod.rs`).
        let mut modules = BTreeMap::<Vec<String>, String>::new();
        for file in &files {
            modules.insert(module_of(file), file.clone());
        }
        let mut edges = BTreeMap::new();
        for file in &files {
            let text = fs::read_to_string(root.join(file)).expect("read a source file");
            let text = match text.find("#[cfg(test)]\nmod tests") {
                Some(end) => &text[..end],
                None => &text[..],
            };
            let mut to = BTreeSet::new();
            let here = module_of(file);
            for path in named_paths(text, &here) {
                if let Some(target) = resolve(&modules, &path) {
                    if target != file {
                        to.insert(target.clone());
                    }
                }
            }
            edges.insert(file.clone(), to);
        }
        Graph { edges }
    }

    /// The strongly connected components of more than one file (Tarjan's).
    fn circles(&self) -> Vec<BTreeSet<String>> {
        struct State<'g> {
            graph: &'g Graph,
            next: usize,
            index: BTreeMap<&'g str, usize>,
            low: BTreeMap<&'g str, usize>,
            stack: Vec<&'g str>,
            on_stack: BTreeSet<&'g str>,
            found: Vec<BTreeSet<String>>,
        }
        fn visit<'g>(s: &mut State<'g>, v: &'g str) {
            s.index.insert(v, s.next);
            s.low.insert(v, s.next);
            s.next += 1;
            s.stack.push(v);
            s.on_stack.insert(v);
            for w in &s.graph.edges[v] {
                let w = w.as_str();
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let low = s.low[v].min(s.low[w]);
                    s.low.insert(v, low);
                } else if s.on_stack.contains(w) {
                    let low = s.low[v].min(s.index[w]);
                    s.low.insert(v, low);
                }
            }
            if s.low[v] == s.index[v] {
                let mut component = BTreeSet::new();
                loop {
                    let w = s.stack.pop().expect("v is on the stack");
                    s.on_stack.remove(w);
                    component.insert(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    s.found.push(component);
                }
            }
        }
        let mut s = State {
            graph: self,
            next: 0,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            found: Vec::new(),
        };
        for v in self.edges.keys() {
            if !s.index.contains_key(v.as_str()) {
                visit(&mut s, v);
            }
        }
        s.found.sort_by_key(|c| std::cmp::Reverse(c.len()));
        s.found
    }
}

/// Every `.rs` file under `dir`, relative to `root`, with `/` separators.
fn walk(root: &Path, files: &mut Vec<String>) {
    fn go(root: &Path, dir: &Path, files: &mut Vec<String>) {
        let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                go(root, &path, files);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(root).expect("under the root");
                let parts: Vec<_> = rel.iter().map(|p| p.to_string_lossy()).collect();
                files.push(parts.join("/"));
            }
        }
    }
    go(root, root, files);
    files.sort();
}

/// `backend/sqlite/mod.rs` -> `[backend, sqlite]`; `lib.rs` -> `[]`.
fn module_of(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The file of the longest prefix of `path` that is a module; never the
/// crate root (a path through its re-exports names no file).
fn resolve<'m>(modules: &'m BTreeMap<Vec<String>, String>, path: &[String]) -> Option<&'m String> {
    (1..=path.len()).rev().find_map(|i| modules.get(&path[..i]))
}

/// The module paths `text` names, from the crate root: every
/// `crate::a::b`, `super::a`, `self::a` path, and each item of a
/// `use crate::{..};` group.
fn named_paths(text: &str, here: &[String]) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let boundary = i == 0 || !is_word(chars[i - 1]);
        let head = ["crate", "super", "self"]
            .into_iter()
            .find(|h| boundary && starts_with(&chars[i..], h));
        let Some(head) = head else {
            i += 1;
            continue;
        };
        let (segments, end) = segments(&chars, i + head.len());
        if segments.is_empty() {
            i += 1;
            continue;
        }
        let mut parts = segments.as_slice();
        let mut base: Vec<String> = match head {
            "crate" => Vec::new(),
            "self" => here.to_vec(),
            _ => {
                let mut base = here[..here.len().saturating_sub(1)].to_vec();
                while parts.first().map(String::as_str) == Some("super") {
                    base.pop();
                    parts = &parts[1..];
                }
                base
            }
        };
        base.extend(parts.iter().cloned());
        paths.push(base);
        i = end;
    }
    paths.extend(use_groups(text, here));
    paths
}

/// The `::ident` segments starting at `at`, and where they end.
fn segments(chars: &[char], mut at: usize) -> (Vec<String>, usize) {
    let mut out = Vec::new();
    while starts_with(&chars[at..], "::")
        && chars
            .get(at + 2)
            .is_some_and(|c| c.is_ascii_alphabetic() || *c == '_')
    {
        let start = at + 2;
        let mut end = start;
        while chars
            .get(end)
            .is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_')
        {
            end += 1;
        }
        out.push(chars[start..end].iter().collect());
        at = end;
    }
    (out, at)
}

/// The leading path of each item of every `use crate::{..};`,
/// `use super::{..};` and `use self::{..};` group, from the crate root
/// (`here` is the module of the file).
fn use_groups(text: &str, here: &[String]) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut rest = text;
    while let Some(at) = find_use_group(rest) {
        let (open, body_start, head) = at;
        let base: Vec<String> = match head {
            "crate" => Vec::new(),
            "self" => here.to_vec(),
            _ => here[..here.len().saturating_sub(1)].to_vec(),
        };
        let after = &rest[body_start..];
        // The group runs to the first `;`, and must end with `};` there.
        let Some(semi) = after.find(';') else { break };
        if !after[..semi].ends_with('}') {
            rest = &rest[open + 1..];
            continue;
        }
        let body = &after[..semi - 1];
        let mut depth = 0i32;
        let mut item = String::new();
        let mut items = Vec::new();
        for c in body.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            if c == ',' && depth == 0 {
                items.push(std::mem::take(&mut item));
            } else {
                item.push(c);
            }
        }
        items.push(item);
        for item in items {
            let chars: Vec<char> = item.trim().chars().collect();
            if !chars
                .first()
                .is_some_and(|c| c.is_ascii_alphabetic() || *c == '_')
            {
                continue;
            }
            let mut end = 0;
            while chars
                .get(end)
                .is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_')
            {
                end += 1;
            }
            let (more, _) = segments(&chars, end);
            let mut path = base.clone();
            path.push(chars[..end].iter().collect::<String>());
            path.extend(more);
            paths.push(path);
        }
        rest = &after[semi..];
    }
    paths
}

/// Where the next `use <whitespace> crate::{` (or `super::{`, `self::{`)
/// starts, where its body does, and its head.
fn find_use_group(text: &str) -> Option<(usize, usize, &'static str)> {
    let mut from = 0;
    while let Some(i) = text[from..].find("use") {
        let at = from + i;
        let after = &text[at + 3..];
        let trimmed = after.trim_start();
        let word = at == 0 || !text[..at].ends_with(is_word);
        for head in ["crate", "super", "self"] {
            let open = format!("{head}::{{");
            if word && trimmed.len() < after.len() && trimmed.starts_with(&open) {
                let body = at + 3 + (after.len() - trimmed.len()) + open.len();
                return Some((at, body, head));
            }
        }
        from = at + 3;
    }
    None
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn starts_with(chars: &[char], s: &str) -> bool {
    s.chars().enumerate().all(|(n, c)| chars.get(n) == Some(&c))
}

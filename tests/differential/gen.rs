//! The random case generator: a context, ignore files, a Dockerfile from a small grammar
//! of what real ones use (FROM scratch only: nothing can be pulled here), project options
//! and 1-3 mutations. `generate(seed, index, modern)` is a pure function; `modern` says
//! the engine's Dockerfile frontend knows `COPY --link` and heredocs (Engine 23+); on an
//! older engine those spots are left out (the random draws are the same).

use std::collections::BTreeMap;

use crate::model::{Case, Content, Entry, Mutation, Node, TarMember, CTX, OUT};
use crate::rng::Rng;

const DIR_NAMES: &[&str] = &[
    "src",
    "lib",
    "real",
    "docs",
    "a",
    "b",
    "sub dir",
    ".git",
    ".cache",
    "node_modules",
    "ünï",
    "目录",
    "build",
    "x",
    "deep",
    "outside",
    "vendor",
    "app",
];
const FILE_NAMES: &[&str] = &[
    "a.txt",
    "b.txt",
    "c.md",
    "main.rs",
    "app.py",
    "README",
    "t.txt",
    "secret.txt",
    ".env",
    ".hidden",
    "with space.txt",
    "日本語.txt",
    "é.txt",
    "data.bin",
    "empty",
    "x",
    "y.json",
    "Makefile",
    "config.yaml",
    "other.txt",
    "keep.txt",
    "ab.txt",
    "1.txt",
    "index.html",
];
const LINK_NAMES: &[&str] = &[
    "link.txt", "l", "ln", "lnk dir", "current", "latest", "to-out", "loop", "self", ".link",
    "alias.md",
];
const WORDS: &[&str] = &[
    "alpha", "beta", "gamma", "hello", "world", "τ", "ünï", "42", "x=1", "#", "$HOME", "\t",
];
const FILE_MODES: &[u32] = &[
    0o644, 0o644, 0o644, 0o644, 0o644, 0o644, 0o755, 0o755, 0o600,
];
const DIR_MODES: &[u32] = &[0o755, 0o755, 0o755, 0o700, 0o775, 0o750];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    File,
    Dir,
    Link,
}

fn parent(path: &str) -> &str {
    path.rfind('/').map_or("", |i| &path[..i])
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn depth(dir: &str) -> usize {
    if dir.is_empty() {
        0
    } else {
        dir.split('/').count()
    }
}

/// What is at `path` in `entries` (explicit entries, and directories implied by them).
fn kind_at(entries: &[Entry], path: &str) -> Option<Kind> {
    if path.is_empty() {
        return Some(Kind::Dir);
    }
    for e in entries {
        if e.path == path {
            return Some(match e.node {
                Node::File { .. } => Kind::File,
                Node::Dir { .. } => Kind::Dir,
                Node::Link { .. } => Kind::Link,
            });
        }
        if e.path.starts_with(path) && e.path[path.len()..].starts_with('/') {
            return Some(Kind::Dir);
        }
    }
    None
}

/// A new entry may go at `path`: nothing there, every ancestor absent or a directory.
fn can_place(entries: &[Entry], path: &str, reserved: &[String]) -> bool {
    if reserved
        .iter()
        .any(|r| r == path || r.starts_with(&format!("{path}/")))
    {
        return false;
    }
    if kind_at(entries, path).is_some() {
        return false;
    }
    let mut p = parent(path);
    while !p.is_empty() {
        match kind_at(entries, p) {
            None | Some(Kind::Dir) => {}
            _ => return false,
        }
        p = parent(p);
    }
    true
}

fn all_dirs(entries: &[Entry]) -> Vec<String> {
    let mut dirs = vec![String::new()];
    for e in entries {
        if e.path.starts_with("../") {
            continue;
        }
        if let Node::Dir { .. } = e.node {
            dirs.push(e.path.clone());
        }
        let mut p = parent(&e.path);
        while !p.is_empty() {
            dirs.push(p.to_string());
            p = parent(p);
        }
    }
    dirs.sort();
    dirs.dedup();
    dirs
}

fn paths_of(entries: &[Entry], kind: Kind) -> Vec<String> {
    entries
        .iter()
        .filter(|e| !e.path.starts_with("../"))
        .filter(|e| {
            matches!(
                (&e.node, kind),
                (Node::File { .. }, Kind::File)
                    | (Node::Dir { .. }, Kind::Dir)
                    | (Node::Link { .. }, Kind::Link)
            )
        })
        .map(|e| e.path.clone())
        .collect()
}

struct Gen {
    rng: Rng,
    modern: bool,
    entries: Vec<Entry>,
    reserved: Vec<String>,
    busybox: Option<String>,
    /// The Dockerfile, once written: ignore patterns mostly leave what it reads alone.
    dockerfile: String,
}

impl Gen {
    fn text(&mut self) -> String {
        let n = self.rng.range(1, 12);
        let mut s = String::new();
        for i in 0..n {
            if i > 0 {
                s.push(if self.rng.chance(20) { '\n' } else { ' ' });
            }
            s.push_str(self.rng.pick::<&str>(WORDS));
        }
        if self.rng.chance(60) {
            s.push('\n');
        }
        s
    }

    fn content(&mut self) -> Content {
        match self.rng.weighted(&[12, 4, 84]) {
            0 => Content::Text(String::new()),
            1 => Content::Random {
                len: self.rng.range(64 * 1024, 2 * 1024 * 1024) as u64,
                seed: self.rng.next_u64(),
            },
            _ => Content::Text(self.text()),
        }
    }

    fn tar_members(&mut self) -> Vec<TarMember> {
        let n = self.rng.range(1, 3);
        let names = ["m/a.txt", "b.txt", "dir/c.txt", ".h", "m/ü.txt"];
        let mut out: Vec<TarMember> = Vec::new();
        for _ in 0..n {
            let path = self.rng.pick(&names).to_string();
            if out.iter().any(|m| m.path == path) {
                continue;
            }
            let text = self.text();
            let mode = *self.rng.pick(FILE_MODES);
            out.push(TarMember { path, text, mode });
        }
        out
    }

    fn add(&mut self, path: String, node: Node) -> bool {
        if !can_place(&self.entries, &path, &self.reserved) {
            return false;
        }
        self.entries.push(Entry { path, node });
        true
    }

    fn random_dir(&mut self) -> String {
        let dirs = all_dirs(&self.entries);
        if self.rng.chance(35) {
            String::new()
        } else {
            self.rng.pick(&dirs).clone()
        }
    }

    /// A symlink target for a link placed in `dir`.
    fn link_target(&mut self, dir: &str, name: &str) -> String {
        let up = "../".repeat(depth(dir));
        let files = paths_of(&self.entries, Kind::File);
        let dirs: Vec<String> = all_dirs(&self.entries)
            .into_iter()
            .filter(|d| !d.is_empty())
            .collect();
        let links = paths_of(&self.entries, Kind::Link);
        loop {
            match self.rng.weighted(&[30, 12, 6, 6, 5, 4, 6, 4, 4, 4, 5]) {
                0 if !files.is_empty() => return format!("{up}{}", self.rng.pick(&files)),
                1 if !dirs.is_empty() => return format!("{up}{}", self.rng.pick(&dirs)),
                // Absolute, as BuildKit reads it: relative to the context root.
                2 if !files.is_empty() => return format!("/{}", self.rng.pick(&files)),
                3 => {
                    return format!(
                        "{up}../outside/{}",
                        self.rng.pick(&["o.txt", "d", "d/p.txt"])
                    )
                }
                4 => return format!("{OUT}/{}", self.rng.pick(&["o.txt", "d"])),
                5 if !files.is_empty() => return format!("{CTX}/{}", self.rng.pick(&files)),
                6 => {
                    return self
                        .rng
                        .pick(&["nope.txt", "../gone", "missing/dir"])
                        .to_string()
                }
                7 => return name.to_string(), // a loop onto itself
                8 => return self.rng.pick(&[".", ".."]).to_string(),
                9 if !links.is_empty() => return format!("{up}{}", self.rng.pick(&links)),
                10 => return format!("{up}{}", self.rng.pick(&["real/t.txt", "a.txt", "src"])),
                _ => continue,
            }
        }
    }

    fn tree(&mut self, wants_busybox: bool) {
        // Outside the context, for links that escape it.
        self.entries.push(Entry {
            path: "../outside/o.txt".into(),
            node: Node::File {
                content: Content::Text("outside\n".into()),
                mode: 0o644,
            },
        });
        self.entries.push(Entry {
            path: "../outside/d/p.txt".into(),
            node: Node::File {
                content: Content::Text("outside dir\n".into()),
                mode: 0o644,
            },
        });
        for _ in 0..self.rng.range(0, 5) {
            let parent = self.random_dir();
            if depth(&parent) >= 3 {
                continue;
            }
            let name = self.rng.pick(DIR_NAMES).to_string();
            let mode = *self.rng.pick(DIR_MODES);
            self.add(join(&parent, &name), Node::Dir { mode });
        }
        // The shapes of defects found before.
        if self.rng.chance(20) {
            let text = self.text();
            self.add(
                "real/t.txt".into(),
                Node::File {
                    content: Content::Text(text),
                    mode: 0o644,
                },
            );
            self.add(
                "link.txt".into(),
                Node::Link {
                    target: "real/t.txt".into(),
                },
            );
        }
        if self.rng.chance(25) {
            self.add(
                "secret.txt".into(),
                Node::File {
                    content: Content::Text("do not ship\n".into()),
                    mode: 0o600,
                },
            );
        }
        if self.rng.chance(8) {
            self.add(
                "outside/o.txt".into(),
                Node::File {
                    content: Content::Text("inside, named like outside\n".into()),
                    mode: 0o644,
                },
            );
        }
        for _ in 0..self.rng.range(1, 10) {
            let dir = self.random_dir();
            let name = self.rng.pick(FILE_NAMES).to_string();
            let content = self.content();
            let mode = *self.rng.pick(FILE_MODES);
            self.add(join(&dir, &name), Node::File { content, mode });
        }
        if self.rng.chance(15) {
            let path = self
                .rng
                .pick(&["pkg.tar", "vendor/pkg.tar.gz", "assets.tgz"])
                .to_string();
            let gzip = !path.ends_with(".tar");
            let members = self.tar_members();
            self.add(
                path,
                Node::File {
                    content: Content::Tar { gzip, members },
                    mode: 0o644,
                },
            );
        }
        if wants_busybox {
            let path = if self.rng.chance(70) {
                "bin/busybox"
            } else {
                "tools/bb"
            };
            if self.add(
                path.into(),
                Node::File {
                    content: Content::Busybox,
                    mode: 0o755,
                },
            ) {
                self.busybox = Some(path.into());
            }
        }
        for _ in 0..self.rng.range(0, 4) {
            let dir = self.random_dir();
            let name = self.rng.pick(LINK_NAMES).to_string();
            if self.rng.chance(10) {
                // A pair of links pointing at each other.
                let other = format!("{name}2");
                self.add(
                    join(&dir, &name),
                    Node::Link {
                        target: other.clone(),
                    },
                );
                self.add(join(&dir, &other), Node::Link { target: name });
                continue;
            }
            let target = self.link_target(&dir, &name);
            self.add(join(&dir, &name), Node::Link { target });
        }
    }

    // ------------------------------------------------------------ ignore files

    /// Whether the Dockerfile (plausibly) reads `path`: it names it or its directory.
    fn referenced(&self, path: &str) -> bool {
        let df = &self.dockerfile;
        df.contains(path) || (!parent(path).is_empty() && df.contains(parent(path)))
    }

    /// A path from `paths`, one the Dockerfile reads with probability `percent`.
    fn pick_path(&mut self, paths: &[String], percent: u32) -> Option<String> {
        let (read, rest): (Vec<&String>, Vec<&String>) =
            paths.iter().partition(|p| self.referenced(p));
        let from = if (self.rng.chance(percent) && !read.is_empty()) || rest.is_empty() {
            read
        } else {
            rest
        };
        (!from.is_empty()).then(|| (*self.rng.pick(&from)).clone())
    }

    fn ignore_line(&mut self) -> String {
        let files = paths_of(&self.entries, Kind::File);
        let links = paths_of(&self.entries, Kind::Link);
        let dirs: Vec<String> = all_dirs(&self.entries)
            .into_iter()
            .filter(|d| !d.is_empty())
            .collect();
        let any: Vec<String> = files.iter().chain(&links).chain(&dirs).cloned().collect();
        loop {
            let prefix = *self.rng.pick(&["", "", "", "", "/", "./"]);
            match self.rng.weighted(&[5, 3, 25, 10, 6, 8, 8, 14, 3, 2, 3, 2]) {
                0 => return format!("# {}", self.text().lines().next().unwrap_or("")),
                1 => return String::new(),
                2 => {
                    if let Some(p) = self.pick_path(&any, 10) {
                        return format!("{prefix}{p}");
                    }
                }
                3 => {
                    if let Some(d) = self.pick_path(&dirs, 10) {
                        return format!("{prefix}{d}/");
                    }
                }
                4 => {
                    return self
                        .rng
                        .pick(&[
                            "*.txt",
                            "*.md",
                            "**/*.txt",
                            "**/.hidden",
                            ".*",
                            "*",
                            "**/*.bin",
                            "*/*.txt",
                            "?.txt",
                            "[ab]*",
                        ])
                        .to_string()
                }
                5 => {
                    if let Some(d) = self.pick_path(&dirs, 10) {
                        return match self.rng.below(3) {
                            0 => format!("{d}/**"),
                            1 => format!("{d}/**/*.txt"),
                            _ => format!("**/{}", d.rsplit('/').next().unwrap()),
                        };
                    }
                }
                6 => {
                    return self
                        .rng
                        .pick(&[
                            "secret.txt",
                            "**/secret.txt",
                            ".env",
                            ".git",
                            "node_modules/",
                            "*.tar*",
                        ])
                        .to_string()
                }
                7 => {
                    if let Some(p) = self.pick_path(&any, 60) {
                        return format!("!{prefix}{p}");
                    }
                }
                8 => {
                    return self
                        .rng
                        .pick(&["Dockerfile", ".dockerignore", "*.dockerignore", "docker"])
                        .to_string()
                }
                9 => {
                    return self
                        .rng
                        .pick(&["**", "bin", "tools", "**/busybox"])
                        .to_string()
                }
                10 => {
                    // Trailing blanks.
                    if let Some(p) = self.pick_path(&any, 10) {
                        return format!("{p}  ");
                    }
                }
                11 => {
                    if let Some(d) = self.pick_path(&dirs, 50) {
                        return format!("!{d}/");
                    }
                }
                _ => continue,
            }
        }
    }

    fn ignore_text(&mut self) -> String {
        let mut s = String::new();
        if self.rng.chance(12) {
            // Allow-list style: everything out, then what the build needs back in.
            s.push_str(if self.rng.chance(80) { "*\n" } else { "**\n" });
            let mut tops: Vec<String> = self
                .entries
                .iter()
                .filter(|e| !e.path.starts_with("../"))
                .map(|e| e.path.split('/').next().unwrap().to_string())
                .collect();
            tops.sort();
            tops.dedup();
            for t in tops {
                if self.referenced(&t) && self.rng.chance(85) {
                    s.push_str(&format!("!{t}\n"));
                }
            }
        }
        for _ in 0..self.rng.range(1, 6) {
            s.push_str(&self.ignore_line());
            s.push('\n');
        }
        s
    }

    // ------------------------------------------------------------ Dockerfile

    /// A COPY/ADD source: a path of the context (file, directory, link), a glob, `.`,
    /// a missing path.
    fn source(&mut self) -> String {
        let files = paths_of(&self.entries, Kind::File);
        let links = paths_of(&self.entries, Kind::Link);
        let dirs: Vec<String> = all_dirs(&self.entries)
            .into_iter()
            .filter(|d| !d.is_empty())
            .collect();
        loop {
            let prefix = *self.rng.pick(&["", "", "", "", "", "", "./", "/"]);
            match self.rng.weighted(&[45, 8, 14, 14, 7, 2, 4]) {
                0 if !files.is_empty() => return format!("{prefix}{}", self.rng.pick(&files)),
                1 if !links.is_empty() => return format!("{prefix}{}", self.rng.pick(&links)),
                2 if !dirs.is_empty() => {
                    let d = self.rng.pick(&dirs).clone();
                    let slash = if self.rng.chance(30) { "/" } else { "" };
                    return format!("{prefix}{d}{slash}");
                }
                3 => {
                    let base = if !dirs.is_empty() && self.rng.chance(40) {
                        format!("{}/", self.rng.pick(&dirs))
                    } else {
                        String::new()
                    };
                    let pat = *self.rng.pick(&[
                        "*", "*.txt", "*.md", "?.txt", "[ab]*", ".*", "*.tar*", "**/*.txt",
                    ]);
                    return format!("{prefix}{base}{pat}");
                }
                4 => return self.rng.pick(&[".", "./", "/"]).to_string(),
                5 => return self.rng.pick(&["missing.txt", "nope/"]).to_string(),
                6 => return self.rng.pick(&["real/t.txt", "link.txt"]).to_string(),
                _ => continue,
            }
        }
    }

    fn mount_source(&mut self) -> Option<String> {
        for _ in 0..10 {
            let s = self.source();
            if !s.contains([' ', ',', '*', '?', '[', '"']) {
                return Some(s);
            }
        }
        None
    }
}

/// `s` as a JSON string (Dockerfile exec/JSON form).
fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

struct Stage {
    name: Option<String>,
    dests: Vec<String>,
    has_busybox: bool,
}

struct Dockerfile<'a> {
    g: &'a mut Gen,
    lines: Vec<String>,
    cont: &'static str,
    n: usize,
    build_args: BTreeMap<String, String>,
    global_arg: Option<String>,
}

impl Dockerfile<'_> {
    fn kw(&mut self, kw: &str) -> String {
        if self.g.rng.chance(8) {
            kw.to_ascii_lowercase()
        } else {
            kw.to_string()
        }
    }

    fn next(&mut self) -> usize {
        self.n += 1;
        self.n
    }

    /// `KW [flags] src… dest`, in JSON form when a word has a blank (or at random).
    fn copy(&mut self, kw: &str, flags: Vec<String>, srcs: Vec<String>, dest: String) {
        let json = srcs.iter().chain([&dest]).any(|s| s.contains(' ')) || self.g.rng.chance(15);
        let kw = self.kw(kw);
        let mut words = vec![kw];
        words.extend(flags);
        let body = if json {
            let items: Vec<String> = srcs.iter().chain([&dest]).map(|s| q(s)).collect();
            format!("[{}]", items.join(", "))
        } else {
            let mut all = srcs.clone();
            all.push(dest);
            all.join(" ")
        };
        words.push(body);
        let sep = if self.g.rng.chance(10) {
            format!(" {}\n    ", self.cont)
        } else {
            " ".into()
        };
        self.lines.push(words.join(&sep));
    }

    fn flags(&mut self, allow_link: bool) -> Vec<String> {
        let mut f = vec![];
        if self.g.rng.chance(15) {
            f.push(format!(
                "--chmod={}",
                self.g.rng.pick(&["0755", "644", "0600", "0444", "777"])
            ));
        }
        // Drawn on every engine; written only where the frontend knows it.
        if self.g.rng.chance(15) && allow_link && self.g.modern {
            f.push("--link".into());
        }
        if self.g.rng.chance(5) {
            f.push("--chown=1000:1000".into());
        }
        f
    }

    fn dest(&mut self, many: bool, workdir: bool) -> String {
        let n = self.next();
        if workdir && self.g.rng.chance(40) {
            return format!("rel{n}/");
        }
        if self.g.rng.chance(5) {
            return format!("/with space {n}/");
        }
        if many || self.g.rng.chance(50) {
            format!("/d{n}/")
        } else {
            format!("/d{n}")
        }
    }

    fn stage(
        &mut self,
        index: usize,
        stages: &mut Vec<Stage>,
        name: Option<String>,
        busybox: bool,
    ) {
        let from = self.kw("FROM");
        // A stage built on an earlier named one (which runs its ONBUILD triggers).
        let named: Vec<usize> = (0..stages.len())
            .filter(|&k| stages[k].name.is_some())
            .collect();
        let base = (!named.is_empty() && self.g.rng.chance(25)).then(|| *self.g.rng.pick(&named));
        let image = base.map_or("scratch".to_string(), |k| stages[k].name.clone().unwrap());
        match &name {
            Some(n) => {
                let as_kw = if self.g.rng.chance(10) { "as" } else { "AS" };
                self.lines.push(format!("{from} {image} {as_kw} {n}"));
            }
            None => self.lines.push(format!("{from} {image}")),
        }
        let mut stage = Stage {
            name,
            dests: vec![],
            has_busybox: base.is_some_and(|k| stages[k].has_busybox),
        };
        if busybox {
            if let Some(bb) = self.g.busybox.clone() {
                let flags = if self.g.rng.chance(20) {
                    vec!["--chmod=0755".to_string()]
                } else {
                    vec![]
                };
                self.copy("COPY", flags, vec![bb], "/bin/busybox".into());
                stage.has_busybox = true;
            }
        }
        let mut workdir = false;
        if let Some(g) = self.global_arg.clone() {
            if self.g.rng.chance(70) {
                self.lines.push(format!("ARG {g}"));
            }
        }
        for _ in 0..self.g.rng.range(1, 4) {
            let weights = [
                35,                                            // COPY
                10,                                            // ADD
                10,                                            // ARG + COPY
                7,                                             // ENV + COPY
                if stage.has_busybox { 25 } else { 0 },        // RUN --mount
                if index > 0 { 10 } else { 0 },                // COPY --from
                5,                                             // heredoc
                5,                                             // WORKDIR
                5,                                             // metadata
                3,                                             // comment
                if self.global_arg.is_some() { 8 } else { 0 }, // global ARG in a path
                4,                                             // ONBUILD COPY
            ];
            match self.g.rng.weighted(&weights) {
                0 => {
                    let many = self.g.rng.chance(20);
                    let mut srcs = vec![self.g.source()];
                    if many {
                        srcs.push(self.g.source());
                    }
                    let flags = self.flags(true);
                    let multi = many
                        || srcs[0].contains(['*', '?', '['])
                        || srcs[0].ends_with('/')
                        || srcs[0] == ".";
                    let dest = self.dest(multi, workdir);
                    stage.dests.push(dest.clone());
                    self.copy("COPY", flags, srcs, dest);
                }
                1 => {
                    let tars = paths_of(&self.g.entries, Kind::File)
                        .into_iter()
                        .filter(|p| p.contains(".tar") || p.ends_with(".tgz"))
                        .collect::<Vec<_>>();
                    let src = if !tars.is_empty() && self.g.rng.chance(60) {
                        self.g.rng.pick(&tars).clone()
                    } else {
                        self.g.source()
                    };
                    let mut flags = self.flags(true);
                    flags.retain(|f| !f.starts_with("--chown"));
                    let dest = self.dest(true, workdir);
                    stage.dests.push(dest.clone());
                    self.copy("ADD", flags, vec![src], dest);
                }
                2 | 3 => {
                    let env = self.g.rng.chance(40);
                    let n = self.next();
                    let name = format!("P{n}");
                    let value = self.g.source();
                    let quoted = if value.contains(' ') || self.g.rng.chance(15) {
                        format!("\"{value}\"")
                    } else {
                        value.clone()
                    };
                    if env {
                        if !value.contains(' ') && self.g.rng.chance(25) {
                            self.lines.push(format!("ENV {name} {value}"));
                        } else {
                            self.lines.push(format!("ENV {name}={quoted}"));
                        }
                    } else if self.g.rng.chance(10) {
                        self.lines.push(format!("ARG {name}"));
                        let v = self.g.source();
                        self.build_args.insert(name.clone(), v);
                    } else {
                        self.lines.push(format!("ARG {name}={quoted}"));
                        if self.g.rng.chance(25) {
                            let v = self.g.source();
                            self.build_args.insert(name.clone(), v);
                        }
                    }
                    let reference = match self.g.rng.below(3) {
                        0 => format!("${name}"),
                        1 => format!("${{{name}}}"),
                        _ => format!("${{{name}:-{}}}", self.g.source()),
                    };
                    let flags = self.flags(true);
                    let dest = self.dest(true, workdir);
                    stage.dests.push(dest.clone());
                    self.copy("COPY", flags, vec![reference], dest);
                }
                4 => {
                    let n = self.next();
                    let target = format!("/mnt/m{n}");
                    let mount = match self.g.rng.weighted(&[20, 10, 70]) {
                        0 => format!("--mount=type=bind,target={target}"),
                        1 if stages.iter().any(|s| s.name.is_some()) => {
                            let named: Vec<String> =
                                stages.iter().filter_map(|s| s.name.clone()).collect();
                            let from = self.g.rng.pick(&named).clone();
                            format!("--mount=type=bind,from={from},target={target}")
                        }
                        _ => match self.g.mount_source() {
                            Some(src) => {
                                format!("--mount=type=bind,source={src},target={target}")
                            }
                            None => format!("--mount=type=bind,target={target}"),
                        },
                    };
                    // Output that depends on names, modes, sizes and contents only.
                    // (Directory sizes depend on the snapshot's history: left out.)
                    let script = format!(
                        "cd {target} 2>/dev/null && find . | sort | while read -r f; do stat -c '%n %a %F' \"$f\"; done > /o{n}; \
                         cd {target} 2>/dev/null && find . -type l | sort | while read -r f; do echo \"$f -> $(readlink \"$f\")\"; done >> /o{n}; \
                         cd {target} 2>/dev/null && find . -type f -exec md5sum {{}} \\; | sort >> /o{n}; \
                         cat {target} > /c{n} 2>/dev/null; true"
                    );
                    let kw = self.kw("RUN");
                    self.lines.push(format!(
                        "{kw} {mount} [\"/bin/busybox\", \"sh\", \"-c\", {}]",
                        q(&script)
                    ));
                }
                5 => {
                    let k = self.g.rng.below(index);
                    let from = stages[k].name.clone().unwrap_or_else(|| k.to_string());
                    let src = if stages[k].dests.is_empty() || self.g.rng.chance(20) {
                        "/".to_string()
                    } else {
                        self.g.rng.pick(&stages[k].dests).clone()
                    };
                    let src = if src.starts_with('/') {
                        src
                    } else {
                        format!("/{src}")
                    };
                    let mut flags = vec![format!("--from={from}")];
                    flags.extend(self.flags(true));
                    let dest = self.dest(true, workdir);
                    stage.dests.push(dest.clone());
                    self.copy("COPY", flags, vec![src], dest);
                }
                6 => {
                    let n = self.next();
                    let text = self.g.text();
                    let chmod = self.g.rng.chance(20);
                    if self.g.modern {
                        let kw = self.kw("COPY");
                        let flag = if chmod { "--chmod=0755 " } else { "" };
                        let mut body = text.replace("EOF", "E0F");
                        if !body.ends_with('\n') {
                            body.push('\n');
                        }
                        self.lines
                            .push(format!("{kw} {flag}<<EOF /h{n}\n{body}EOF"));
                        stage.dests.push(format!("/h{n}"));
                    }
                }
                7 => {
                    let n = self.next();
                    let kw = self.kw("WORKDIR");
                    self.lines.push(format!("{kw} /w{n}"));
                    workdir = true;
                }
                8 => {
                    let line = match self.g.rng.below(4) {
                        0 => "LABEL org.example.k=\"v w\"".to_string(),
                        1 => "ENV MODE=test".to_string(),
                        2 => "CMD [\"/bin/busybox\", \"true\"]".to_string(),
                        _ => "ENTRYPOINT [\"/bin/busybox\"]".to_string(),
                    };
                    self.lines.push(line);
                }
                9 => self.lines.push("# a comment line".into()),
                11 => {
                    // Runs in the stages built FROM this one, not in this one.
                    let src = self.g.source();
                    let dest = self.dest(true, false);
                    let kw = self.kw("ONBUILD");
                    let copy = if src.contains(' ') {
                        format!("COPY [{}, {}]", q(&src), q(&dest))
                    } else {
                        format!("COPY {src} {dest}")
                    };
                    self.lines.push(format!("{kw} {copy}"));
                }
                _ => {
                    let g = self.global_arg.clone().unwrap();
                    let dest = self.dest(true, workdir);
                    stage.dests.push(dest.clone());
                    let flags = self.flags(true);
                    self.copy("COPY", flags, vec![format!("${{{g}}}")], dest);
                }
            }
        }
        stages.push(stage);
    }
}

/// Case `index` of `seed`.
pub fn generate(seed: u64, index: u64, modern: bool) -> Case {
    let mut g = Gen {
        rng: Rng::for_case(seed, index),
        modern,
        entries: vec![],
        reserved: vec![],
        busybox: None,
        dockerfile: String::new(),
    };
    let dockerfile_path = match g.rng.weighted(&[80, 10, 10]) {
        0 => "Dockerfile",
        1 => "docker/app.Dockerfile",
        _ => "build.Dockerfile",
    }
    .to_string();
    g.reserved = vec![
        dockerfile_path.clone(),
        format!("{dockerfile_path}.dockerignore"),
        ".dockerignore".into(),
    ];
    let wants_run = g.rng.chance(35);
    g.tree(wants_run);

    let cont = if g.rng.chance(5) { "`" } else { "\\" };
    let n_stages = 1 + g.rng.weighted(&[50, 35, 15]);
    let run_stage = g
        .rng
        .below(n_stages)
        .max(if g.rng.chance(60) { n_stages - 1 } else { 0 });
    let mut df = Dockerfile {
        g: &mut g,
        lines: vec![],
        cont,
        n: 0,
        build_args: BTreeMap::new(),
        global_arg: None,
    };
    if cont == "`" {
        df.lines.push("# escape=`".into());
    }
    if df.g.rng.chance(15) {
        let v = df.g.source();
        let v = if v.contains(' ') {
            format!("\"{v}\"")
        } else {
            v
        };
        df.lines.push(format!("ARG GSRC={v}"));
        df.global_arg = Some("GSRC".into());
        if df.g.rng.chance(25) {
            let o = df.g.source();
            df.build_args.insert("GSRC".into(), o);
        }
    }
    let mut stages = vec![];
    for i in 0..n_stages {
        let named = i + 1 < n_stages || df.g.rng.chance(50);
        let name = named.then(|| format!("s{i}"));
        df.stage(i, &mut stages, name, wants_run && i == run_stage);
    }
    let mut text = df.lines.join("\n");
    text.push('\n');
    let build_args = df.build_args;
    let named: Vec<String> = stages.iter().filter_map(|s| s.name.clone()).collect();
    let target = (named.len() >= 2 && g.rng.chance(25)).then(|| g.rng.pick(&named).clone());
    g.dockerfile = text.clone();
    let ignore = g.rng.chance(65).then(|| g.ignore_text());
    let specific_ignore = g.rng.chance(30).then(|| {
        let mut t = g.ignore_text();
        if g.rng.chance(70) {
            t.push_str("secret.txt\n");
        }
        t
    });

    let mut case = Case {
        entries: g.entries.clone(),
        dockerfile_path,
        dockerfile: text,
        ignore,
        specific_ignore,
        target,
        build_args,
        mutations: vec![],
    };
    case.mutations = mutations(&mut g, &case);
    case
}

// ------------------------------------------------------------------ mutations

/// Paths the Dockerfile plausibly reads (named in it, or under a directory named in it),
/// and, apart, the targets of the symlinks among them (what COPY follows).
fn relevant(case: &Case, entries: &[Entry]) -> (Vec<String>, Vec<String>) {
    let df = &case.dockerfile;
    let (mut read, mut targets) = (vec![], vec![]);
    for e in entries {
        let mut p = e.path.as_str();
        let mut hit = false;
        while !p.is_empty() {
            if df.contains(p) {
                hit = true;
                break;
            }
            p = parent(p);
        }
        if !hit {
            continue;
        }
        read.push(e.path.clone());
        if let Node::Link { target } = &e.node {
            let t = target.trim_start_matches(CTX).trim_start_matches('/');
            let mut base = if target.starts_with('/') || target.starts_with(CTX) {
                String::new()
            } else {
                parent(&e.path).to_string()
            };
            let mut rest = t;
            while let Some(r) = rest.strip_prefix("../") {
                base = parent(&base).to_string();
                rest = r;
            }
            targets.push(join(&base, rest));
        }
    }
    (read, targets)
}

fn mutations(g: &mut Gen, case: &Case) -> Vec<Mutation> {
    let mut state = g.entries.clone();
    let mut ignore = case.ignore.clone();
    let mut specific = case.specific_ignore.clone();
    let mut out = vec![];
    let n = 1 + g.rng.weighted(&[45, 35, 20]);
    for _ in 0..n {
        g.entries = state.clone();
        let (mut rel, targets) = relevant(case, &state);
        let files: Vec<String> = state
            .iter()
            .filter(|e| matches!(e.node, Node::File { .. }) && !e.path.starts_with("../"))
            .map(|e| e.path.clone())
            .collect();
        let rel_files: Vec<String> = files.iter().filter(|f| rel.contains(f)).cloned().collect();
        let target_files: Vec<String> = files
            .iter()
            .filter(|f| targets.contains(f))
            .cloned()
            .collect();
        rel.extend(targets);
        let links = paths_of(&state, Kind::Link);
        // Many mutations hit what the build reads (link targets, named files); the rest
        // hit any file, where a rerun may rightly reuse the build.
        let pick_file = |g: &mut Gen| -> Option<String> {
            if !target_files.is_empty() && g.rng.chance(30) {
                Some(g.rng.pick(&target_files).clone())
            } else if !rel_files.is_empty() && g.rng.chance(45) {
                Some(g.rng.pick(&rel_files).clone())
            } else if !files.is_empty() {
                Some(g.rng.pick(&files).clone())
            } else {
                None
            }
        };
        let weights = [
            22,
            12,
            10,
            if links.is_empty() { 0 } else { 10 },
            12,
            10,
            14,
            10,
        ];
        let m = match g.rng.weighted(&weights) {
            0 => pick_file(g).map(|path| {
                let old = state.iter().find(|e| e.path == path).unwrap();
                let content = match &old.node {
                    Node::File {
                        content: Content::Tar { gzip, members },
                        ..
                    } => {
                        let mut members = members.clone();
                        let i = g.rng.below(members.len().max(1));
                        if let Some(m) = members.get_mut(i) {
                            if g.rng.chance(50) {
                                m.text = g.text();
                            } else {
                                m.mode = *g.rng.pick(FILE_MODES);
                            }
                        }
                        Content::Tar {
                            gzip: *gzip,
                            members,
                        }
                    }
                    Node::File {
                        content: Content::Random { len, .. },
                        ..
                    } => Content::Random {
                        len: if g.rng.chance(50) { *len } else { *len + 1 },
                        seed: g.rng.next_u64(),
                    },
                    _ => g.content(),
                };
                let keep_mtime = g.rng.chance(25);
                Mutation::Write {
                    path,
                    content,
                    keep_mtime,
                }
            }),
            1 => pick_file(g).map(|path| Mutation::FlipByte {
                path,
                at: g.rng.next_u64() % 4096,
                keep_mtime: g.rng.chance(30),
            }),
            2 => {
                let dirs = all_dirs(&state);
                let mut cands: Vec<String> = rel.clone();
                cands.extend(dirs.into_iter().filter(|d| !d.is_empty()));
                if g.rng.chance(30) || cands.is_empty() {
                    pick_file(g).map(|path| Mutation::Chmod {
                        mode: *g.rng.pick(&[0o644, 0o755, 0o600, 0o700, 0o666, 0o640]),
                        path,
                    })
                } else {
                    let path = g.rng.pick(&cands).clone();
                    let mode = *g.rng.pick(&[0o644, 0o755, 0o600, 0o700, 0o775, 0o750]);
                    Some(Mutation::Chmod { path, mode })
                }
            }
            3 => {
                let path = g.rng.pick(&links).clone();
                let name = path.rsplit('/').next().unwrap().to_string();
                let target = g.link_target(parent(&path), &name);
                Some(Mutation::Retarget { path, target })
            }
            4 => {
                let dir = g.random_dir();
                let (path, node) = match g.rng.weighted(&[60, 15, 15, 10]) {
                    0 => (
                        join(
                            &dir,
                            g.rng
                                .pick::<&str>(&[FILE_NAMES, &["new.txt", "z.txt"]].concat()),
                        ),
                        Node::File {
                            content: g.content(),
                            mode: *g.rng.pick(FILE_MODES),
                        },
                    ),
                    1 => (
                        join(
                            &dir,
                            g.rng.pick::<&str>(&["newdir", "empty dir", "src", "a"]),
                        ),
                        Node::Dir {
                            mode: *g.rng.pick(DIR_MODES),
                        },
                    ),
                    2 => {
                        let name = g.rng.pick(LINK_NAMES).to_string();
                        let target = g.link_target(&dir, &name);
                        (join(&dir, &name), Node::Link { target })
                    }
                    _ => (
                        join(&join(&dir, "newdir"), "n.txt"),
                        Node::File {
                            content: Content::Text("new\n".into()),
                            mode: 0o644,
                        },
                    ),
                };
                let reserved = g.reserved.clone();
                can_place(&state, &path, &reserved).then_some(Mutation::Add {
                    entry: Entry { path, node },
                })
            }
            5 => {
                let mut cands: Vec<String> = rel.clone();
                cands.extend(
                    state
                        .iter()
                        .filter(|e| !e.path.starts_with("../"))
                        .map(|e| e.path.clone()),
                );
                cands.extend(all_dirs(&state).into_iter().filter(|d| !d.is_empty()));
                (!cands.is_empty()).then(|| Mutation::Remove {
                    path: g.rng.pick(&cands).clone(),
                })
            }
            6 => {
                let which_specific = if specific.is_some() {
                    g.rng.chance(60)
                } else {
                    g.rng.chance(20)
                };
                let current = if which_specific { &specific } else { &ignore }.clone();
                let text = match (current, g.rng.weighted(&[35, 25, 15, 15, 10])) {
                    (Some(t), 0) => Some(format!("{t}{}\n", g.ignore_line())),
                    (Some(t), 1) => {
                        let mut lines: Vec<&str> = t.lines().collect();
                        if !lines.is_empty() {
                            lines.remove(g.rng.below(lines.len()));
                        }
                        Some(lines.iter().map(|l| format!("{l}\n")).collect())
                    }
                    (Some(t), 2) => Some(format!("{t}# only a comment changed\n")),
                    (Some(_), 3) => None,
                    (None, 3) if g.rng.chance(50) => Some("secret.txt\n".into()),
                    _ => Some(g.ignore_text()),
                };
                if which_specific {
                    specific = text.clone();
                } else {
                    ignore = text.clone();
                }
                Some(Mutation::SetIgnore {
                    specific: which_specific,
                    text,
                })
            }
            _ => {
                let mut cands = rel.clone();
                cands.extend(files.clone());
                cands.push(case.dockerfile_path.clone());
                if case.ignore.is_some() {
                    cands.push(".dockerignore".into());
                }
                Some(Mutation::Touch {
                    path: g.rng.pick(&cands).clone(),
                })
            }
        };
        let Some(m) = m else { continue };
        // Follow the tree for the next mutation's choices.
        match &m {
            Mutation::Add { entry } => state.push(entry.clone()),
            Mutation::Remove { path } => {
                state.retain(|e| e.path != *path && !e.path.starts_with(&format!("{path}/")))
            }
            Mutation::Retarget { path, target } => {
                for e in state.iter_mut() {
                    if e.path == *path {
                        e.node = Node::Link {
                            target: target.clone(),
                        };
                    }
                }
            }
            Mutation::Write { path, content, .. } => {
                for e in state.iter_mut() {
                    if e.path == *path {
                        if let Node::File { content: c, .. } = &mut e.node {
                            *c = content.clone();
                        }
                    }
                }
            }
            _ => {}
        }
        out.push(m);
    }
    if g.rng.chance(5) {
        out.push(Mutation::Write {
            path: "../outside/o.txt".into(),
            content: Content::Text("outside, changed\n".into()),
            keep_mtime: false,
        });
    }
    out
}

//! The workspace keeps its shape: dependencies point one way, and `unsafe` stays where it is allowed.

use std::path::Path;

/// (package, kinetrace packages it may depend on: normal and build dependencies).
///
/// The direction: core ← export ← analysis; core, cupti-sys ← cupti; core, rocprofiler-sdk-sys,
/// roctracer-sys ← rocm; core, export ← dynolog (the dynolog client); export ← perfetto (the
/// `.pftrace` converter reads through the trace reader); the facade (`kinetrace`) →
/// core, export, cupti, rocm, dynolog, perfetto; the injected-process runtime (`kinetrace-agent`)
/// → facade (+ core, export); the shim (`kinetrace-preload`) → agent only; the cli → agent,
/// facade, analysis, perfetto (+ core, export).
/// Nothing depends on cli or preload, and only tests depend on the test doubles. Every file
/// kinetrace creates goes through `kinetrace-files`, which depends on nothing of ours; export,
/// perfetto, dynolog, agent and cli use it.
const ALLOWED: &[(&str, &[&str])] = &[
    ("kinetrace-core", &[]),
    ("kinetrace-files", &[]),
    ("kinetrace-export", &["kinetrace-core", "kinetrace-files"]),
    (
        "kinetrace-analysis",
        &["kinetrace-export", "kinetrace-core"],
    ),
    (
        "kinetrace-cli",
        &[
            "kinetrace-agent",
            "kinetrace",
            "kinetrace-analysis",
            "kinetrace-perfetto",
            "kinetrace-export",
            "kinetrace-core",
            "kinetrace-files",
        ],
    ),
    (
        "kinetrace",
        &[
            "kinetrace-core",
            "kinetrace-export",
            "kinetrace-cupti",
            "kinetrace-rocm",
            "kinetrace-dynolog",
            "kinetrace-perfetto",
        ],
    ),
    (
        "kinetrace-dynolog",
        &["kinetrace-core", "kinetrace-export", "kinetrace-files"],
    ),
    // The Perfetto format: Kineto JSON in through the trace reader (its input layer and limits),
    // protobuf out (files through kinetrace-files).
    (
        "kinetrace-perfetto",
        &["kinetrace-export", "kinetrace-core", "kinetrace-files"],
    ),
    (
        "kinetrace-agent",
        &[
            "kinetrace",
            "kinetrace-core",
            "kinetrace-export",
            "kinetrace-files",
        ],
    ),
    ("kinetrace-cupti-sys", &[]),
    (
        "kinetrace-cupti",
        &["kinetrace-core", "kinetrace-cupti-sys"],
    ),
    ("kinetrace-fake-cupti", &["kinetrace-cupti-sys"]),
    ("kinetrace-rocprofiler-sdk-sys", &[]),
    ("kinetrace-roctracer-sys", &[]),
    (
        "kinetrace-rocm",
        &[
            "kinetrace-core",
            "kinetrace-rocprofiler-sdk-sys",
            "kinetrace-roctracer-sys",
        ],
    ),
    (
        "kinetrace-fake-rocprofiler-sdk",
        &["kinetrace-rocprofiler-sdk-sys"],
    ),
    ("kinetrace-fake-roctracer", &["kinetrace-roctracer-sys"]),
    // The shim holds entry points only; everything else is the agent's.
    ("kinetrace-preload", &["kinetrace-agent"]),
    // Test doubles and helpers: below the facade, so every crate's tests may use them.
    (
        "kinetrace-test-support",
        &["kinetrace-core", "kinetrace-export"],
    ),
];

/// (package, what its tests, examples and benches may use besides [`ALLOWED`]): test doubles and
/// crates below or beside it, never one that depends on it.
const DEV_ALLOWED: &[(&str, &[&str])] = &[
    // Core and export sit below the test support crate, so their tests cannot use it.
    ("kinetrace-core", &[]),
    ("kinetrace-files", &[]),
    ("kinetrace-export", &[]),
    ("kinetrace-analysis", &["kinetrace-test-support"]),
    ("kinetrace-cli", &["kinetrace-test-support"]),
    (
        "kinetrace",
        &[
            "kinetrace-test-support",
            "kinetrace-fake-cupti",
            "kinetrace-fake-rocprofiler-sdk",
        ],
    ),
    ("kinetrace-agent", &["kinetrace-test-support"]),
    ("kinetrace-cupti-sys", &["kinetrace-fake-cupti"]),
    (
        "kinetrace-cupti",
        &["kinetrace-test-support", "kinetrace-fake-cupti"],
    ),
    ("kinetrace-fake-cupti", &[]),
    ("kinetrace-rocprofiler-sdk-sys", &[]),
    ("kinetrace-roctracer-sys", &[]),
    (
        "kinetrace-rocm",
        &[
            "kinetrace-test-support",
            "kinetrace-fake-rocprofiler-sdk",
            "kinetrace-fake-roctracer",
            "kinetrace-export",
        ],
    ),
    ("kinetrace-fake-rocprofiler-sdk", &[]),
    ("kinetrace-dynolog", &[]),
    ("kinetrace-perfetto", &[]),
    ("kinetrace-fake-roctracer", &[]),
    (
        "kinetrace-preload",
        &[
            "kinetrace-test-support",
            "kinetrace-fake-cupti",
            "kinetrace-fake-rocprofiler-sdk",
            "kinetrace-core",
            "kinetrace-export",
        ],
    ),
    ("kinetrace-test-support", &[]),
];

/// Crates kept out of the main workspace (so `cargo test --workspace` never builds their heavy
/// dependencies), built from their own workspace, with the kinetrace crates they may depend on.
const OUTSIDE: &[(&str, &str, &[&str])] = &[
    // The burn/cubecl adapter: built and tested from examples/burn.
    (
        "crates/burn/Cargo.toml",
        "kinetrace-burn",
        &["kinetrace-core"],
    ),
];

fn table<'a>(t: &'a [(&str, &'a [&'a str])], name: &str) -> &'a [&'a str] {
    t.iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| {
            panic!("package {name} has no entry in ALLOWED and DEV_ALLOWED: add one stating what it may depend on")
        })
        .1
}

/// The workspace's kinetrace packages with their kinetrace dependencies: (package, dependency, kind)
/// where kind is `normal`, `dev` or `build`.
fn kinetrace_edges() -> Vec<(String, String, String)> {
    let mut metadata = std::process::Command::new(env!("CARGO"));
    metadata
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    let out = crate::util::output_within(metadata, std::time::Duration::from_secs(120));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut edges = Vec::new();
    for pkg in meta["packages"].as_array().unwrap() {
        let name = pkg["name"].as_str().unwrap();
        if !name.starts_with("kinetrace") {
            continue;
        }
        // A package with no kinetrace dependency still has to be in the tables.
        edges.push((name.to_string(), String::new(), String::new()));
        for dep in pkg["dependencies"].as_array().unwrap() {
            let d = dep["name"].as_str().unwrap();
            if d.starts_with("kinetrace") {
                let kind = dep["kind"].as_str().unwrap_or("normal");
                edges.push((name.to_string(), d.to_string(), kind.to_string()));
            }
        }
    }
    edges
}

/// Whether `from` reaches `to` through normal and build dependencies.
fn reaches(edges: &[(String, String, String)], from: &str, to: &str) -> bool {
    let mut seen = vec![from.to_string()];
    let mut i = 0;
    while i < seen.len() {
        let here = seen[i].clone();
        for (p, d, k) in edges {
            if *p == here && !d.is_empty() && k != "dev" && !seen.contains(d) {
                seen.push(d.clone());
            }
        }
        i += 1;
    }
    seen.iter().skip(1).any(|p| p == to)
}

#[test]
fn dependencies_point_the_right_way() {
    let edges = kinetrace_edges();
    let mut packages: Vec<&str> = edges.iter().map(|(p, _, _)| p.as_str()).collect();
    packages.dedup();
    for (name, dep, kind) in &edges {
        let (normal, dev) = (table(ALLOWED, name), table(DEV_ALLOWED, name));
        if dep.is_empty() {
            continue;
        }
        match kind.as_str() {
            "dev" => {
                assert!(
                    normal.contains(&dep.as_str()) || dev.contains(&dep.as_str()),
                    "{name}'s tests must not depend on {dep} (dev-dependency); use kinetrace-test-support or a crate below {name}"
                );
                // Never up: a dev edge to a crate that itself depends on this one.
                assert!(
                    !reaches(&edges, dep, name),
                    "{name}'s tests depend on {dep}, which depends on {name}: a dev-dependency pointing up"
                );
            }
            _ => assert!(
                normal.contains(&dep.as_str()),
                "{name} must not depend on {dep} ({kind} dependency)"
            ),
        }
    }
    // Nothing depends on the cli or the shim, and only tests use the test doubles.
    for (name, dep, kind) in &edges {
        assert!(
            !matches!(dep.as_str(), "kinetrace-cli" | "kinetrace-preload"),
            "{name} depends on {dep}"
        );
        if matches!(
            dep.as_str(),
            "kinetrace-test-support" | "kinetrace-fake-cupti" | "kinetrace-fake-rocprofiler-sdk"
        ) {
            assert_eq!(
                kind, "dev",
                "{name} depends on the test double {dep} outside its tests"
            );
        }
    }
    assert!(packages.len() >= 3, "{packages:?}");
    // The "up" check sees through the graph: the facade reaches cupti, not the other way round.
    assert!(reaches(&edges, "kinetrace-preload", "kinetrace-cupti"));
    assert!(!reaches(&edges, "kinetrace-cupti", "kinetrace"));
}

/// The main workspace never builds burn or cubecl (only examples/burn's own workspace does), and
/// the crates outside it depend on what [`OUTSIDE`] allows.
#[test]
fn framework_crates_stay_outside_the_workspace() {
    let edges = kinetrace_edges();
    for (name, _, _) in &edges {
        for (_, outside, _) in OUTSIDE {
            assert_ne!(
                name, outside,
                "{outside} must not be a member of the main workspace"
            );
        }
    }
    let mut metadata = std::process::Command::new(env!("CARGO"));
    metadata
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    let out = crate::util::output_within(metadata, std::time::Duration::from_secs(120));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for pkg in meta["packages"].as_array().unwrap() {
        for dep in pkg["dependencies"].as_array().unwrap() {
            let d = dep["name"].as_str().unwrap();
            assert!(
                !(d.starts_with("burn") || d.starts_with("cubecl") || d.starts_with("candle")),
                "{} depends on {d}: framework crates belong to the examples' own workspaces",
                pkg["name"]
            );
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (manifest, name, allowed) in OUTSIDE {
        let text = std::fs::read_to_string(root.join(manifest)).unwrap();
        assert!(
            text.contains(&format!("name = \"{name}\"")),
            "{manifest} names {name}"
        );
        for line in text.lines() {
            let key = line.split('=').next().unwrap_or("").trim();
            if key.starts_with("kinetrace") && key != "kinetrace-burn" {
                assert!(
                    allowed.contains(&key),
                    "{name} must not depend on {key} ({manifest})"
                );
            }
        }
    }
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn unsafe_code_only_where_allowed_and_always_explained() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let allowed_dirs = [
        "sys/",
        "crates/cupti/",
        "crates/rocm/",
        "crates/preload/",
        "tests/fakes/",
    ];
    let mut files = Vec::new();
    for d in ["src", "crates", "sys", "tests"] {
        if root.join(d).exists() {
            rust_files(&root.join(d), &mut files);
        }
    }
    for f in files {
        let rel = f
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        // This file names the pattern; bindgen's output is regenerated, not written by hand.
        if rel == "tests/it/workspace.rs" || rel.contains("/generated/") {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if !(code.contains("unsafe {") || code.contains("unsafe impl")) {
                continue;
            }
            // In core only the ring and the time-stamp-counter read (`rdtsc`, an intrinsic that
            // is `unsafe` by declaration only) may hold it.
            let ok_place = allowed_dirs.iter().any(|d| rel.starts_with(d))
                || rel == "crates/core/src/ring.rs"
                || rel == "crates/core/src/clock/tsc.rs";
            assert!(
                ok_place,
                "{rel}:{}: unsafe outside the crates allowed to hold it",
                i + 1
            );
            let explained = lines[..i]
                .iter()
                .rev()
                .take(4)
                .any(|l| l.contains("SAFETY:"));
            assert!(
                explained,
                "{rel}:{}: unsafe without a `// SAFETY:` line just above",
                i + 1
            );
        }
    }
}

//! The workspace keeps its shape: dependencies point one way, and `unsafe` stays where it is allowed.

use std::path::Path;

/// (package, kinetrace packages it may depend on).
const ALLOWED: &[(&str, &[&str])] = &[
    ("kinetrace-core", &[]),
    ("kinetrace-export", &["kinetrace-core"]),
    (
        "kinetrace-analysis",
        &["kinetrace-export", "kinetrace-core"],
    ),
    (
        "kinetrace-cli",
        &[
            "kinetrace",
            "kinetrace-analysis",
            "kinetrace-export",
            "kinetrace-core",
        ],
    ),
    (
        "kinetrace",
        &["kinetrace-core", "kinetrace-export", "kinetrace-cupti"],
    ),
    ("kinetrace-cupti-sys", &[]),
    (
        "kinetrace-cupti",
        &["kinetrace-core", "kinetrace-cupti-sys"],
    ),
    ("kinetrace-fake-cupti", &["kinetrace-cupti-sys"]),
    // The shim holds entry points only; everything else is the facade's.
    ("kinetrace-preload", &["kinetrace"]),
];

#[test]
fn dependencies_point_the_right_way() {
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
    let mut checked = 0;
    for pkg in meta["packages"].as_array().unwrap() {
        let name = pkg["name"].as_str().unwrap();
        if !name.starts_with("kinetrace") {
            continue;
        }
        let allowed = ALLOWED
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| {
                panic!(
                    "package {name} has no entry in ALLOWED: add one stating what it may depend on"
                )
            })
            .1;
        for dep in pkg["dependencies"].as_array().unwrap() {
            let d = dep["name"].as_str().unwrap();
            if d.starts_with("kinetrace") && dep["kind"].is_null() {
                assert!(allowed.contains(&d), "{name} must not depend on {d}");
            }
        }
        checked += 1;
    }
    assert!(checked >= 3);
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

//! The fault matrix in `docs/reliability.md` names, for every fault, the tests that cover it: each
//! named test must exist, so the document cannot drift from the suite.

use std::path::Path;

fn test_sources(dir: &Path, out: &mut String) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        let name = e.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if p.is_dir() {
            test_sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs" || x == "py") {
            out.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
        }
    }
}

#[test]
fn every_test_the_fault_matrix_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/reliability.md")).unwrap();
    let mut sources = String::new();
    for d in ["src", "crates", "sys", "tests"] {
        test_sources(&root.join(d), &mut sources);
    }
    let mut named = 0;
    let mut missing = Vec::new();
    for row in doc
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| **"))
    {
        let Some(cell) = row.trim_end_matches('|').rsplit('|').next() else {
            continue;
        };
        // Backticked words in the "Test" column: test names (a path or file names where they are).
        for quoted in cell.split('`').skip(1).step_by(2) {
            let name = quoted.rsplit("::").next().unwrap_or(quoted);
            let is_test_name = name.len() > 8
                && name.contains('_')
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if !is_test_name {
                continue;
            }
            named += 1;
            // A Rust test, or a Python one (tests/preload, tests/compat).
            if !sources.contains(&format!("fn {name}("))
                && !sources.contains(&format!("def {name}("))
            {
                missing.push(name.to_string());
            }
        }
    }
    assert!(
        named > 40,
        "only {named} test names found in docs/reliability.md"
    );
    assert!(
        missing.is_empty(),
        "docs/reliability.md names tests that do not exist: {missing:?}"
    );
}
